"""Hearth's desktop app: wiring, the engine worker thread, stores, and the Qt UI."""
