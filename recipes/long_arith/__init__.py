"""long-arith: step-by-step addition of 7-25 digit numbers (64-256 response tokens) with a ~3.2M-parameter Qwen2
and a character-level tokenizer padded to 4096 ids: a workload with realistic response lengths and a vocabulary
whose [tokens, vocab] log-softmax costs something, for timing the RL step and the engine (bench/long_arith.py).

Modules:
    tokenizer  -- ``build_tokenizer`` (built locally, no downloads)
    data       -- ``solution``, ``make_problems``, ``eval_problems``, ``ensure_prompt_files``
    reward     -- ``reward`` (exact final answer = 1, else partial credit for correct steps) and ``mean_reward``
    model      -- ``model_config`` for the Qwen2 (the size comes from the warm-up settings)
    settings   -- ``WarmupSettings``, ``checkpoint_path`` (light: no torch)
    bootstrap  -- ``ensure_checkpoint``: the cached SFT warm-up checkpoint (float32, a fixed step count)
"""
