"""Trainer backends and the pure loss / advantage functions they share."""
