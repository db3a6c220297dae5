"""Qt widgets: thin views that render state and emit intents."""
