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
from mae.models.targets import target_class, target_of

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
    return hf_config_of(model.config, decoder=True, mask_ratio=mask_ratio)


def hf_config_of(config: dict[str, Any], decoder: bool, mask_ratio: float = 0.75) -> dict[str, Any]:
    """The ``config.json`` dict of the model an MAE ``config`` describes: ``ViTMAEForPreTraining`` (encoder
    and decoder) with ``decoder``, else ``ViTMAEModel`` (the encoder alone).

    Raises:
        ConfigError: what ViTMAE cannot represent, naming the value: a decoder other than the paper's
            self-attention one, a target other than pixels with the decoder, or a non-square input with the
            decoder (transformers' decoder and loss assume a square patch grid; its encoder takes any
            ``image_size`` [H, W]).
    """
    height, width = (config["img_size"],) * 2 if isinstance(config["img_size"], int) else config["img_size"]
    patch, embed_dim = config["patch_size"], config["embed_dim"]
    if decoder and config.get("decoder_type", "self") != "self":
        raise ConfigError(
            f"Hugging Face ViTMAE has only the paper's self-attention decoder, not decoder_type "
            f"{config['decoder_type']!r}; export the encoder alone (--encoder-only), which every variant "
            "shares"
        )
    if decoder and height != width:
        raise ConfigError(
            f"Hugging Face ViTMAEForPreTraining supports square inputs only, got img_size {height}x{width}; "
            "export the encoder alone (--encoder-only: ViTMAEModel takes any size) or use --to timm"
        )
    target = target_of(config)
    if decoder and not target_class(target).pixels:
        raise ConfigError(
            f"Hugging Face ViTMAEForPreTraining's decoder predicts pixels, but this model's predicts target "
            f"{target!r}; export the encoder alone (--encoder-only), which every target shares"
        )
    hf = {
        "architectures": ["ViTMAEForPreTraining" if decoder else "ViTMAEModel"],
        "model_type": "vit_mae",
        "image_size": height if height == width else [height, width],
        "patch_size": patch,
        "num_channels": config["in_chans"],
        "hidden_size": embed_dim,
        "num_hidden_layers": config["depth"],
        "num_attention_heads": config["num_heads"],
        "intermediate_size": int(embed_dim * config["mlp_ratio"]),
        "hidden_act": "gelu",
        "layer_norm_eps": config["layer_norm_eps"],
        "qkv_bias": True,
        "mask_ratio": mask_ratio,
        "norm_pix_loss": target == "norm_pix",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
    }
    if decoder:
        hf.update(
            decoder_hidden_size=config["decoder_embed_dim"],
            decoder_num_hidden_layers=config["decoder_depth"],
            decoder_num_attention_heads=config["decoder_num_heads"],
            decoder_intermediate_size=int(config["decoder_embed_dim"] * config["mlp_ratio"]),
        )
    return hf


def hf_classifier_config(config: dict[str, Any], num_labels: int) -> dict[str, Any]:
    """The ``config.json`` dict of a ``ViTForImageClassification`` with the encoder of an MAE ``config`` and
    ``num_labels`` classes: transformers' ViT classifies the cls token after the final LayerNorm (its
    ``layernorm``) with one linear layer (its ``classifier``)."""
    hf = hf_config_of(config, decoder=False)
    for key in ("mask_ratio", "norm_pix_loss"):
        hf.pop(key)
    labels = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    hf.update(
        architectures=["ViTForImageClassification"],
        model_type="vit",
        id2label=labels,
        label2id={name: int(i) for i, name in labels.items()},
    )
    return hf


def hf_classifier_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A token-pooling classifier's state dict (our encoder, a linear ``head``) ->
    ``ViTForImageClassification``'s (hub layout: the ViTMAE encoder names, which are ViT's, and
    ``classifier``)."""
    head = {f"classifier.{p}": state_dict[f"head.{p}"] for p in ("weight", "bias")}
    encoder = {k: v for k, v in state_dict.items() if not k.startswith(("head.", "fc_norm."))}
    return {**to_hf_state_dict(encoder), **head}


def hf_encoder_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our encoder's state dict -> ``ViTMAEModel``'s (hub layout, without the ``vit.`` prefix)."""
    encoder = {k: v for k, v in state_dict.items() if not (k.startswith("decoder") or k == "mask_token")}
    return {k.removeprefix("vit."): v for k, v in to_hf_state_dict(encoder).items()}


def save_hf_pretrained(model: MaskedAutoencoderViT, out_dir: str | Path, mask_ratio: float = 0.75) -> Path:
    """Write ``config.json`` + ``model.safetensors`` that ``ViTMAEForPreTraining.from_pretrained`` loads."""
    config = hf_config(model, mask_ratio)  # first: it refuses what ViTMAE cannot hold
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in to_hf_state_dict(model.state_dict()).items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
