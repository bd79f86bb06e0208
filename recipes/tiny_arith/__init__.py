"""tiny-arith: two-digit addition with a ~0.3M-parameter Qwen2 and a char-level tokenizer.

Modules:
    tokenizer  -- ``build_tokenizer`` / ``tokenizer_fingerprint`` (built locally, no downloads)
    data       -- ``make_problems``, ``format_prompt``, ``eval_problems`` (the whole eval split)
    reward     -- ``reward`` (exact match) and ``accuracy``
    model      -- ``model_config`` / ``build_model`` for the tiny Qwen2
    bootstrap  -- ``ensure_checkpoint``: cached, weakly warm-started SFT checkpoint for RL (float64, fixed steps)
"""
