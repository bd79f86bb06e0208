"""Task recipes for rollflow: self-contained tokenizer/data/reward/model bundles."""
