"""The decoder variants (``mae.models.decoder_variants``): partial reconstruction (``decoder_keep_ratio``)
and the cross-attention decoder (``decoder_type="cross"``, ``decoder_encoder_layers``). The switches' checks
are ``test_decoder_switches.py``'s, the class the factory builds ``test_factory.py``'s, their FLOP count
``test_flops.py``'s; the default path's bit-identity is ``test_default_path.py``'s."""

import pytest
import torch

from mae.convert.huggingface import save_hf_pretrained
from mae.models.masking import check_decoded_patches
from tests.helpers import pretrain_module, tiny_mae


def _normalised_patches(model, imgs):
    target = model.patchify(imgs)
    return (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()


def test_partial__loss_is_the_masked_mse_of_the_chosen_patches_only():
    model = tiny_mae(decoder_keep_ratio=0.25, norm_pix_loss=True).train()
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
    model = tiny_mae(decoder_keep_ratio=0.5).train()
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
    model = tiny_mae(decoder_keep_ratio=0.25).train()
    imgs, noise = torch.randn(4, 3, 32, 32), torch.rand(4, 64)
    _, pred, mask = model(imgs, 0.75, noise)
    decoded_masked = (pred.abs().sum(-1) > 0) & mask.bool()
    assert decoded_masked.sum(1).tolist() == [12] * 4 and len({tuple(r.tolist()) for r in decoded_masked}) > 1
    model.eval()
    loss, pred, mask = model(imgs, 0.75, noise)
    assert bool((pred.abs().sum(-1) > 0).all())
    torch.testing.assert_close(loss, ((pred - model.patchify(imgs)) ** 2).mean(-1)[mask.bool()].mean())


def test_cross__prediction_of_a_patch_does_not_depend_on_the_other_queries():
    model = tiny_mae(decoder_type="cross").train()
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
    model = tiny_mae(decoder_keep_ratio=0.5).train()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    latent, mask, ids_restore = model.forward_encoder(imgs, 0.75, noise)
    masked = torch.stack([torch.nonzero(m).flatten() for m in mask])
    alone = model.forward_decoder(latent, ids_restore, masked[:, :1])
    more = model.forward_decoder(latent, ids_restore, masked[:, :20])
    assert not torch.allclose(alone[:, masked[0, 0]], more[:, masked[0, 0]])


def test_cross__training_queries_the_masked_patches_evaluation_every_patch_with_the_same_predictions():
    model = tiny_mae(decoder_type="cross", norm_pix_loss=True)
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
    model = tiny_mae(decoder_type="cross", decoder_encoder_layers=[0, 1]).train()
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


def test_cross_layers__forward_encoder_returns_the_paper_s_latent_and_the_layers_come_from_their_own_method():
    model = tiny_mae(decoder_type="cross", decoder_encoder_layers=[0, 1]).train()
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
        save_hf_pretrained(tiny_mae(decoder_type="cross"), tmp_path)
