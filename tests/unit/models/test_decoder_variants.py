"""The decoder variants (``mae.models.decoder_variants``): partial reconstruction (``decoder_keep_ratio``),
the cross-attention decoder (``decoder_type="cross"``, ``decoder_encoder_layers``), the class the factory
builds for them, their FLOP count and their bad input. The default path's bit-identity is
``tests/unit/models/test_default_path.py``'s."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mae.convert.huggingface import save_hf_pretrained
from mae.models import MaskedAutoencoderViT, build_mae, create_model
from mae.models.decoder_variants import CrossMAE, PartialReconstructionMAE
from mae.models.flops import mae_forward_flops
from mae.models.masking import check_decoded_patches
from mae.training.runtime import set_attention_kernel
from tests.helpers import TINY, pretrain_module

VARIANTS = {
    "partial": dict(decoder_keep_ratio=0.25),
    "cross": dict(decoder_type="cross"),
    "cross_partial": dict(decoder_type="cross", decoder_keep_ratio=0.25),
    "cross_layers": dict(decoder_type="cross", decoder_encoder_layers=[0, -1]),
}


def _model(seed: int = 0, **kwargs) -> MaskedAutoencoderViT:
    torch.manual_seed(seed)
    return build_mae(**TINY, **kwargs)


def _normalised_patches(model, imgs):
    target = model.patchify(imgs)
    return (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()


def test_partial__loss_is_the_masked_mse_of_the_chosen_patches_only():
    model = _model(decoder_keep_ratio=0.25, norm_pix_loss=True).train()
    imgs, noise, decoder_noise = torch.randn(3, 3, 32, 32), torch.rand(3, 64), torch.rand(3, 64)
    loss, pred, mask = model(imgs, 0.75, noise, decoder_noise)

    # independently: per image, the 12 (= int(48 * 0.25)) masked patches with the smallest decoder noise
    chosen = torch.zeros(3, 64, dtype=torch.bool)
    for n in range(3):
        masked = torch.nonzero(mask[n]).flatten()
        chosen[n, masked[decoder_noise[n, masked].argsort()[:12]]] = True
    per_patch = ((pred - _normalised_patches(model, imgs)) ** 2).mean(-1)
    torch.testing.assert_close(loss, per_patch[chosen].mean())
    assert not torch.isclose(loss, per_patch[mask.bool()].mean())  # not the paper's loss over all 48
    decoded = pred.abs().sum(-1) > 0
    assert torch.equal(decoded, chosen | ~mask.bool())  # visible and chosen patches only; the rest 0


def test_partial__decoder_sees_visible_tokens_plus_the_chosen_mask_tokens_at_their_positions():
    """The chosen patches' predictions against the decoder run by hand on [cls, every visible token,
    the chosen mask tokens], in patch order (the model puts them in another order: attention does not
    care)."""
    model = _model(decoder_keep_ratio=0.5).train()
    imgs, noise, decoder_noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64), torch.rand(2, 64)
    _, pred, mask = model(imgs, 0.75, noise, decoder_noise)
    latent, _, ids_restore = model.forward_encoder(imgs, 0.75, noise)
    x = model.decoder_embed(latent)
    for n in range(2):
        visible = torch.nonzero(mask[n] == 0).flatten()  # in patch order; latent holds them in noise order
        tokens = dict(zip(noise[n, visible].argsort().tolist(), x[n, 1:], strict=True))
        tokens = {visible[i].item(): t for i, t in tokens.items()}
        masked = torch.nonzero(mask[n]).flatten()
        for patch in masked[decoder_noise[n, masked].argsort()[:24]].tolist():
            tokens[patch] = model.mask_token[0, 0]
        order = sorted(tokens)
        seq = (
            torch.stack([x[n, 0]] + [tokens[p] for p in order])
            + model.decoder_pos_embed[0, [0] + [p + 1 for p in order]]
        )
        out = model.decoder_pred(model.decoder_norm(model.decoder_blocks(seq[None])))[0, 1:]
        torch.testing.assert_close(pred[n, order], out, rtol=1e-5, atol=1e-5)


def test_partial__draws_its_own_subset_and_evaluation_reconstructs_every_masked_patch():
    model = _model(decoder_keep_ratio=0.25).train()
    imgs, noise = torch.randn(4, 3, 32, 32), torch.rand(4, 64)
    _, pred, mask = model(imgs, 0.75, noise)
    decoded_masked = (pred.abs().sum(-1) > 0) & mask.bool()
    assert decoded_masked.sum(1).tolist() == [12] * 4 and len({tuple(r.tolist()) for r in decoded_masked}) > 1
    model.eval()
    loss, pred, mask = model(imgs, 0.75, noise)
    assert bool((pred.abs().sum(-1) > 0).all())
    torch.testing.assert_close(loss, ((pred - model.patchify(imgs)) ** 2).mean(-1)[mask.bool()].mean())


def test_cross__prediction_of_a_patch_does_not_depend_on_the_other_queries():
    model = _model(decoder_type="cross").train()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    latent, mask, ids_restore = model.forward_encoder(imgs, 0.75, noise)
    masked = torch.stack([torch.nonzero(m).flatten() for m in mask])  # (2, 48)
    target = masked[:, :1]
    alone = model.forward_decoder(latent, ids_restore, target)
    with_some = model.forward_decoder(latent, ids_restore, torch.cat([target, masked[:, 5:9]], 1))
    with_others = model.forward_decoder(latent, ids_restore, torch.cat([masked[:, 20:40], target], 1))
    rows = torch.arange(2)
    for pred in (with_some, with_others):
        torch.testing.assert_close(pred[rows, target[:, 0]], alone[rows, target[:, 0]], rtol=1e-6, atol=1e-6)

    # perturbing the other queries' tokens before the first block leaves the first query's output alone
    def perturb(block, args):
        x, context = args
        return torch.cat([x[:, :1], x[:, 1:] + 10 * torch.randn_like(x[:, 1:])], 1), context

    ids = masked[:, :10]
    clean = model.forward_decoder(latent, ids_restore, ids)
    hook = model.decoder_blocks[0].register_forward_pre_hook(perturb)
    noisy = model.forward_decoder(latent, ids_restore, ids)
    hook.remove()
    first, others = ids[:, 0], ids[:, 1]
    torch.testing.assert_close(noisy[rows, first], clean[rows, first], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(noisy[rows, others], clean[rows, others])


def test_self_decoder__prediction_of_a_patch_does_depend_on_the_other_mask_tokens():
    """The contrast that makes the cross-decoder test meaningful."""
    model = _model(decoder_keep_ratio=0.5).train()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    latent, mask, ids_restore = model.forward_encoder(imgs, 0.75, noise)
    masked = torch.stack([torch.nonzero(m).flatten() for m in mask])
    alone = model.forward_decoder(latent, ids_restore, masked[:, :1])
    more = model.forward_decoder(latent, ids_restore, masked[:, :20])
    assert not torch.allclose(alone[:, masked[0, 0]], more[:, masked[0, 0]])


def test_cross__training_queries_the_masked_patches_evaluation_every_patch_with_the_same_predictions():
    model = _model(decoder_type="cross", norm_pix_loss=True)
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    train_loss, train_pred, mask = model.train()(imgs, 0.75, noise)
    eval_loss, eval_pred, _ = model.eval()(imgs, 0.75, noise)
    assert torch.equal(train_pred.abs().sum(-1) > 0, mask.bool())  # masked patches only
    assert bool((eval_pred.abs().sum(-1) > 0).all())  # every patch, for the figures
    masked = mask.bool()
    torch.testing.assert_close(eval_pred[masked], train_pred[masked], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eval_loss, train_loss, rtol=1e-5, atol=1e-6)
    per_patch = ((train_pred - _normalised_patches(model, imgs)) ** 2).mean(-1)
    torch.testing.assert_close(train_loss, per_patch[masked].mean())


def test_cross__each_decoder_block_reads_its_encoder_layer():
    model = _model(decoder_type="cross", decoder_encoder_layers=[0, 1]).train()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    outputs, contexts = [], []
    hooks = [b.register_forward_hook(lambda m, a, out: outputs.append(out)) for b in model.blocks]
    hooks += [
        b.register_forward_pre_hook(lambda m, args: contexts.append(args[1])) for b in model.decoder_blocks
    ]
    model(imgs, 0.75, noise)
    for hook in hooks:
        hook.remove()
    visible = noise.argsort(1)[:, :16]  # the visible patches, in the order the encoder holds them
    pos = torch.cat(
        [model.decoder_pos_embed[:, :1].expand(2, -1, -1), model.decoder_pos_embed[0, 1:][visible]], 1
    )
    for block, layer in ((0, 0), (1, 1)):
        expected = model.decoder_embed(model.norm(outputs[layer])) + pos
        torch.testing.assert_close(contexts[block], expected)
    assert not torch.allclose(contexts[0], contexts[1])


@pytest.mark.parametrize("kwargs", [{}, *VARIANTS.values()], ids=["paper", *VARIANTS])
def test_flops__analytic_count_equals_torch_flop_counter_in_a_training_step(kwargs):
    model = set_attention_kernel(_model(**kwargs).train(), "explicit")  # SDPA's CPU kernel is not counted
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32), 0.75)
    assert counter.get_total_flops() == 2 * mae_forward_flops(model, 0.75)


def test_flops__the_switches_cut_decoding_work():
    paper = mae_forward_flops(_model(), 0.75)
    counts = {name: mae_forward_flops(_model(**kw), 0.75) for name, kw in VARIANTS.items()}
    assert counts["cross_partial"] < counts["partial"] < paper and counts["cross"] < paper


@pytest.mark.parametrize(
    "kwargs", [dict(decoder_type="cross"), dict(decoder_type="cross", decoder_keep_ratio=0.5)]
)
def test_cross__both_attention_kernels_agree(kwargs):
    model = _model(**kwargs).train()
    imgs, noise, decoder_noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64), torch.rand(2, 64)
    fused = model(imgs, 0.75, noise, decoder_noise)[1]
    explicit = set_attention_kernel(model, "explicit")(imgs, 0.75, noise, decoder_noise)[1]
    assert not model.decoder_blocks[0].attn.fused_attn
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(decoder_type="crosss"), "decoder_type 'crosss' is unknown; expected one of ('self', 'cross')"),
        (dict(decoder_keep_ratio=0.0), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio=-0.5), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio=1.5), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio="half"), "decoder_keep_ratio must be a number in (0, 1]"),
        (
            dict(decoder_type="cross", decoder_encoder_layers=[0, 5]),
            "names encoder layer 5, which does not exist: the encoder has 2 blocks, so allowed values are "
            "0..1",
        ),
        (
            dict(decoder_type="cross", decoder_encoder_layers=[-3, 1]),
            "names encoder layer -3, which does not exist",
        ),
        (dict(decoder_type="cross", decoder_encoder_layers=[1]), "one encoder layer per decoder block (2)"),
        (dict(decoder_type="cross", decoder_encoder_layers=[0, 0]), "never reads the last encoder layer"),
        (dict(decoder_encoder_layers=[0, 1]), "decoder_encoder_layers [0, 1] needs decoder_type 'cross'"),
    ],
)
def test_switches__bad_values_are_named_with_the_allowed_ones(kwargs, message):
    for build in (build_mae, MaskedAutoencoderViT):  # the values are checked before the class is
        with pytest.raises(ValueError) as error:
            build(**TINY, **kwargs)
        assert message in str(error.value)


CLASSES = {"paper": MaskedAutoencoderViT, "partial": PartialReconstructionMAE, "cross": CrossMAE}


@pytest.mark.parametrize("name", ["paper", *VARIANTS])
def test_switches__the_factory_builds_the_class_that_implements_them_with_the_paper_s_state_dict_keys(name):
    kwargs, cls = VARIANTS.get(name, {}), CLASSES[name.split("_")[0]]
    model = build_mae(**TINY, **kwargs)
    assert type(model) is cls and isinstance(model, MaskedAutoencoderViT)
    assert type(create_model("mae_vit_tiny_patch4", depth=2, decoder_depth=2, **kwargs)) is cls
    paper = MaskedAutoencoderViT(**TINY)
    if cls is not CrossMAE:
        assert list(model.state_dict()) == list(paper.state_dict())
    else:  # the cross blocks' own names, under the same decoder_blocks.<i> prefix
        encoder = [key for key in paper.state_dict() if not key.startswith("decoder_blocks.")]
        assert [key for key in model.state_dict() if not key.startswith("decoder_blocks.")] == encoder
    assert model.config == {**paper.config, **kwargs, "decoder_encoder_layers": model.decoder_encoder_layers}


def test_switches__the_paper_s_class_refuses_a_variant_s_switches_naming_the_factory():
    with pytest.raises(
        ValueError, match="MaskedAutoencoderViT does not implement decoder_type 'cross' .*build_mae"
    ):
        MaskedAutoencoderViT(**TINY, decoder_type="cross")
    with pytest.raises(ValueError, match="CrossMAE does not implement decoder_type 'self'"):
        CrossMAE(**TINY)


def test_cross_layers__forward_encoder_returns_the_paper_s_latent_and_the_layers_come_from_their_own_method():
    model = _model(decoder_type="cross", decoder_encoder_layers=[0, 1]).train()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    latent, mask, ids_restore = model.forward_encoder(imgs, 0.75, noise)
    assert latent.shape == (2, 17, 64)
    layers, mask2, ids_restore2 = model.forward_encoder_layers(imgs, 0.75, noise)
    assert (
        layers.shape == (2, 2, 17, 64) and torch.equal(mask, mask2) and torch.equal(ids_restore, ids_restore2)
    )
    torch.testing.assert_close(layers[1], latent)  # the last layer, normed, is forward_encoder's output
    with pytest.raises(ValueError, match="takes the output of forward_encoder_layers"):
        model.forward_decoder(latent, ids_restore)
    assert model.forward_decoder(layers, ids_restore).shape == (2, 64, 48)


def test_partial__a_ratio_rounding_to_no_patch_is_refused_at_start_up_naming_the_smallest_that_works():
    with pytest.raises(
        ValueError,
        match=r"decoder_keep_ratio 0.02 reconstructs int\(48 \* 0.02\) = 0 .* use at least "
        r"0.0209 \(1 patch\)",
    ):
        pretrain_module(img_size=32, decoder_keep_ratio=0.02)
    check_decoded_patches((8, 8), 0.75, 0.0209)  # the suggested value keeps one
    with pytest.raises(ValueError, match="masks no patch .* nothing to reconstruct"):
        pretrain_module(img_size=32, decoder_type="cross", mask_ratio=0.0)
    with pytest.raises(ValueError, match="model.model_kwargs sets .'decoder_type'.; set model.decoder_type"):
        pretrain_module(img_size=32, model_kwargs={"decoder_type": "cross"})
    assert (
        pretrain_module(img_size=32, mask_ratio=0.0).model.decoder_type == "self"
    )  # the paper's case is as it was


def test_hugging_face_export__refuses_the_cross_decoder_by_name(tmp_path):
    with pytest.raises(ValueError, match="only the paper's self-attention decoder, not decoder_type 'cross'"):
        save_hf_pretrained(_model(decoder_type="cross"), tmp_path)
