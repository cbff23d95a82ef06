"""One vLLM generation run for tests/test_inference_vllm.py (run in the vLLM venv, as a script:
vLLM's engine starts its processes with spawn, which re-imports this file in each of them).

    python tests/vllm_run.py MODEL_DIR OUT_JSON '[[1, 2, 3], [4, 5]]' [MAX_TOKENS [compiled]]

Greedy generation of the prompts (token ids, no tokenizer) in one ``LLM.generate`` call; the
generated token ids per prompt go to OUT_JSON. The probe plugin is active when the caller sets
``PROBE_CONFIG`` (or ``PROBE_TEST_ADDITIONAL_CONFIG``: passed as ``additional_config``'s
``dump_config_path``, vllm-ascend's form). ``PROBE_TEST_ATTN_SCALE=1.05`` scales the CPU attention's output in every
process (a fault below the API, inside ``vllm.unified_attention_with_output``); with
``PROBE_TEST_ATTN_FAULT_AT=decode`` only in steps that decode (one query token per request).
``PROBE_TEST_DTYPE`` (default float32): the model's dtype in vLLM (bfloat16: a served bf16 run);
``PROBE_TEST_MAX_NUM_SEQS=1``: the scheduler serves one request at a time (vllm#9567's setting).
"""
import json
import os
import sys

_scale = float(os.environ.get("PROBE_TEST_ATTN_SCALE", "0") or 0)
_decode_only = os.environ.get("PROBE_TEST_ATTN_FAULT_AT") == "decode"
if _scale:   # at import: the EngineCore and the worker re-import this file (spawn)
    from vllm.v1.attention.backends import cpu_attn

    _forward = cpu_attn.CPUAttentionBackendImpl.forward

    def _scaled(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *args, **kwargs):
        out = _forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if attn_metadata is not None and output is not None and (not _decode_only or attn_metadata.max_query_len == 1):
            output.mul_(_scale)   # a kernel's numerical fault, below every dumped API
        return out

    cpu_attn.CPUAttentionBackendImpl.forward = _scaled


def save_tiny_llama(path):
    """A 2-layer Llama with head_dim 32 (the CPU attention's minimum), random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         torch_dtype="float32", bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)


def main(model_dir, out_json, prompts, max_tokens, eager=True):
    from vllm import LLM, SamplingParams
    extra = {}
    if os.environ.get("PROBE_TEST_ADDITIONAL_CONFIG"):   # vllm-ascend's --additional-config form
        extra["additional_config"] = {"dump_config_path": os.environ["PROBE_TEST_ADDITIONAL_CONFIG"]}
    llm = LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=eager,
              dtype=os.environ.get("PROBE_TEST_DTYPE", "float32"), max_model_len=256,
              max_num_seqs=int(os.environ.get("PROBE_TEST_MAX_NUM_SEQS", "8")), seed=0, **extra)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outs], f)


if __name__ == "__main__":
    if sys.argv[1] == "--save-model":
        save_tiny_llama(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 4,
             eager=sys.argv[5:6] != ["compiled"])
