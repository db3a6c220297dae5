"""Tests for the engine package."""
