"""Data files shipped with Hearth: icons and the curated model list."""
