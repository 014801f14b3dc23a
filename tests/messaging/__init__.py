"""Peer messaging: receipts, bounds, waits, revival, tools, events."""
