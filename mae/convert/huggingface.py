"""Hugging Face ``ViTMAEForPreTraining`` <-> our ``MaskedAutoencoderViT`` weights.

We write the layout of the files on the Hugging Face hub (transformers 4.x names, unfused
query/key/value), which every transformers release loads; transformers 5 renames them on load.
Reading accepts that layout and transformers 5's in-memory names.
"""

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mae.errors import ConfigError
from mae.models.mae import MaskedAutoencoderViT

# Ours -> hub layout, outside the transformer blocks.
_TOP_LEVEL = {
    "cls_token": "vit.embeddings.cls_token",
    "pos_embed": "vit.embeddings.position_embeddings",
    "patch_embed.proj": "vit.embeddings.patch_embeddings.projection",
    "norm": "vit.layernorm",
    "mask_token": "decoder.mask_token",
    "decoder_pos_embed": "decoder.decoder_pos_embed",
    "decoder_embed": "decoder.decoder_embed",
    "decoder_norm": "decoder.decoder_norm",
    "decoder_pred": "decoder.decoder_pred",
}
_BLOCK_PREFIX = {"blocks": "vit.encoder.layer", "decoder_blocks": "decoder.decoder_layers"}
# Ours -> hub layout, inside a block (qkv is split separately).
_IN_BLOCK = {
    "norm1": "layernorm_before",
    "attn.proj": "attention.output.dense",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
_QKV = ("attention.attention.query", "attention.attention.key", "attention.attention.value")
# transformers 5 names -> hub names (in memory, and as its save_pretrained writes the decoder).
_V5_TO_HUB = [
    (r"^vit\.layers\.", "vit.encoder.layer."),
    (r"^decoder\.decoder_encoder\.layer\.", "decoder.decoder_layers."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> ``ViTMAEForPreTraining`` state dict (hub layout, q/k/v unfused)."""
    out = {}
    for key, value in state_dict.items():
        if m := re.match(r"^(blocks|decoder_blocks)\.(\d+)\.(.+)\.(weight|bias)$", key):
            group, idx, module, param = m.groups()
            prefix = f"{_BLOCK_PREFIX[group]}.{idx}"
            if module == "attn.qkv":
                for name, chunk in zip(_QKV, value.chunk(3, dim=0), strict=True):
                    out[f"{prefix}.{name}.{param}"] = chunk.clone()
            else:
                out[f"{prefix}.{_IN_BLOCK[module]}.{param}"] = value
            continue
        module, _, param = key.rpartition(".") if key not in _TOP_LEVEL else (key, "", "")
        if module not in _TOP_LEVEL:
            raise KeyError(f"no Hugging Face ViTMAE name for parameter {key!r}")
        out[_TOP_LEVEL[module] + (f".{param}" if param else "")] = value
    return out


def from_hf_state_dict(hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``ViTMAEForPreTraining`` state dict (hub or transformers-5 layout) -> our layout."""
    normalized = {}
    for key, value in hf_state_dict.items():
        for pattern, repl in _V5_TO_HUB:
            key = re.sub(pattern, repl, key)
        normalized[key] = value

    hub_to_ours_top = {v: k for k, v in _TOP_LEVEL.items()}
    hub_to_ours_block = {v: k for k, v in _IN_BLOCK.items()}
    hub_to_ours_prefix = {v: k for k, v in _BLOCK_PREFIX.items()}
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in normalized.items():
        if m := re.match(r"^(vit\.encoder\.layer|decoder\.decoder_layers)\.(\d+)\.(.+)\.(weight|bias)$", key):
            prefix, idx, module, param = m.groups()
            ours = f"{hub_to_ours_prefix[prefix]}.{idx}"
            if module in _QKV:
                qkv.setdefault(f"{ours}.attn.qkv.{param}", {})[module] = value
            elif module in hub_to_ours_block:
                out[f"{ours}.{hub_to_ours_block[module]}.{param}"] = value
            else:
                raise KeyError(f"unexpected Hugging Face ViTMAE parameter {key!r}")
            continue
        module, _, param = key.rpartition(".")
        if key in hub_to_ours_top:
            out[hub_to_ours_top[key]] = value
        elif module in hub_to_ours_top:
            out[f"{hub_to_ours_top[module]}.{param}"] = value
        else:
            raise KeyError(f"unexpected Hugging Face ViTMAE parameter {key!r}")
    for key, parts in qkv.items():
        missing = [name for name in _QKV if name not in parts]
        if missing:
            raise KeyError(f"{key}: Hugging Face checkpoint lacks {missing}")
        out[key] = torch.cat([parts[name] for name in _QKV], dim=0)
    return out


def hf_config(model: MaskedAutoencoderViT, mask_ratio: float = 0.75) -> dict[str, Any]:
    """The ``ViTMAEConfig`` (as a ``config.json`` dict) of the same architecture as ``model``."""
    grid_h, grid_w = model.grid_size
    if model.decoder_type != "self":
        raise ConfigError(
            f"Hugging Face ViTMAE has only the paper's self-attention decoder, not decoder_type "
            f"{model.decoder_type!r}; export the encoder instead (mae export), which every variant shares"
        )
    if grid_h != grid_w:
        raise ConfigError(
            f"Hugging Face ViTMAE supports square inputs only, got a {grid_h}x{grid_w} patch grid"
        )
    block, decoder_block = model.blocks[0], model.decoder_blocks[0]
    return {
        "architectures": ["ViTMAEForPreTraining"],
        "model_type": "vit_mae",
        "image_size": grid_h * model.patch_size,
        "patch_size": model.patch_size,
        "num_channels": model.patch_embed.proj.in_channels,
        "hidden_size": model.cls_token.shape[-1],
        "num_hidden_layers": len(model.blocks),
        "num_attention_heads": block.attn.num_heads,
        "intermediate_size": block.mlp.fc1.out_features,
        "decoder_hidden_size": model.mask_token.shape[-1],
        "decoder_num_hidden_layers": len(model.decoder_blocks),
        "decoder_num_attention_heads": decoder_block.attn.num_heads,
        "decoder_intermediate_size": decoder_block.mlp.fc1.out_features,
        "hidden_act": "gelu",
        "layer_norm_eps": model.norm.eps,
        "qkv_bias": True,
        "mask_ratio": mask_ratio,
        "norm_pix_loss": model.norm_pix_loss,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
    }


def save_hf_pretrained(model: MaskedAutoencoderViT, out_dir: str | Path, mask_ratio: float = 0.75) -> Path:
    """Write ``config.json`` + ``model.safetensors`` that ``ViTMAEForPreTraining.from_pretrained`` loads."""
    config = hf_config(model, mask_ratio)  # first: it refuses what ViTMAE cannot hold
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in to_hf_state_dict(model.state_dict()).items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
