"""Tests for the app package."""
