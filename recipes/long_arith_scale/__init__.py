"""long-arith at real model sizes: the long-arith prompts and reward with randomly initialised Qwen2 models of
~50M parameters (`long-arith-50m`) and of the Qwen2.5-0.5B shape (`long-arith-0.5b`), over the long-arith
character tokenizer padded to Qwen2's 151,936 ids. For measuring what the loop costs as the model grows
(bench/scaling.py); the weights are not trained (no warm-up), so the runs measure cost, not learning.

Modules:
    model      -- ``ModelShape``, ``SHAPES`` (the two sizes), ``model_config``, ``num_parameters`` (light: no torch)
    tokenizer  -- ``build_tokenizer`` (long-arith's ids and chat template, padded to ``VOCAB_SIZE``)
    settings   -- ``RECIPE_VERSION``, ``checkpoint_path`` (light: no torch, no model)
    bootstrap  -- ``ensure_checkpoint``: the cached randomly initialised checkpoint (float32 safetensors)
"""
