"""Run nanotron's own config loader on export YAML files, one case per JSON line.

usage: PYTHONPATH=<nanotron's src/ at c2528430> python nanotron_config.py < cases.jsonl
Each case: {"yaml": path}. nanotron.config.get_config_from_file reads the YAML and builds its
dataclasses with dacite (strict=True: an unknown or mistyped field is refused), casting pp_engine
to an engine object and tp_mode to TensorParallelLinearMode; the answer is what it built.
"""

# ruff: noqa: E402  (warnings and logging are silenced before nanotron's imports, which emit them)

import json
import sys
import warnings

warnings.filterwarnings("ignore")
import logging

logging.disable(logging.WARNING)

from nanotron.config import get_config_from_file

for line in sys.stdin:
    case = json.loads(line)
    try:
        cfg = get_config_from_file(case["yaml"])
        par, tok, mc = cfg.parallelism, cfg.tokens, cfg.model.model_config
        out = {
            "ok": True,
            "dp": par.dp,
            "tp": par.tp,
            "pp": par.pp,
            "pp_engine": type(par.pp_engine).__name__,
            "tp_mode": par.tp_mode.name,
            "async": par.tp_linear_async_communication,
            "recompute_layer": par.recompute_layer,
            "sequence_length": tok.sequence_length,
            "micro_batch_size": tok.micro_batch_size,
            "grad_accum": tok.batch_accumulation_per_replica,
            "global_batch_size": cfg.global_batch_size,
            "zero_stage": cfg.optimizer.zero_stage,
            "fp32_grads": cfg.optimizer.accumulate_grad_in_fp32,
            "dtype": str(cfg.model.dtype),
            "model_class": type(mc).__name__,
            "model": [
                mc.num_hidden_layers,
                mc.hidden_size,
                mc.num_attention_heads,
                mc.num_key_value_heads,
                mc.intermediate_size,
                mc.vocab_size,
                mc.tie_word_embeddings,
                mc.max_position_embeddings,
            ],
            "dummy_data": cfg.data_stages[0].data.dataset is None,
            "rope": [mc.rope_theta, mc.rope_scaling, mc.rms_norm_eps],
            "tokens": [mc.bos_token_id, mc.eos_token_id, mc.pad_token_id],
        }
    except Exception as e:  # a refused config is the answer, whatever the loader raises
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
