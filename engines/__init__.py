"""Inference engines behind one interface (`engines.base.Engine`), reached through `engines.registry`."""
