import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models.resnet import Bottleneck, ResNet

from trainopt_core.reproduction import models
from trainopt_core.reproduction.gpt2 import CompactGPT2


def test_resnet50_cifar_has_16_bottleneck_blocks_and_the_cifar_stem():
    with torch.device("meta"):
        model = models.resnet50_cifar()
    assert isinstance(model, ResNet)
    blocks = model.checkpoint_blocks
    assert len(blocks) == 16 and all(isinstance(b, Bottleneck) for b in blocks)
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3]
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.padding == (1, 1)
    assert model.conv1.bias is None
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 10


def test_resnet50_cifar_matches_torchvision_resnet50_except_the_stem():
    with torch.device("meta"):
        ours = models.resnet50_cifar(num_classes=10)
        reference = torchvision.models.resnet50(num_classes=10)
    stem_difference = 64 * 3 * (7 * 7 - 3 * 3)  # 7x7 ImageNet stem -> 3x3 CIFAR stem
    assert models.count_parameters(ours) == models.count_parameters(reference) - stem_difference
    assert models.count_parameters(ours) == pytest.approx(23.5e6, rel=0.005)
    ours_shapes = [p.shape for name, p in ours.named_parameters() if not name.startswith("conv1")]
    reference_shapes = [p.shape for name, p in reference.named_parameters() if not name.startswith("conv1")]
    assert ours_shapes == reference_shapes


def test_scaled_down_resnet_keeps_the_block_sequence_and_classifies_32px_images():
    model = models.build_model("resnet", "smoke")
    assert len(model.checkpoint_blocks) == 16
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    assert models.count_parameters(model) < models.count_parameters(models.build_model("resnet", "quick"))


def test_resnet_residual_branches_start_as_identity_unless_asked_otherwise():
    model = models.resnet_cifar((1, 1, 1, 1), width=4)
    assert all(torch.count_nonzero(block.bn3.weight) == 0 for block in model.checkpoint_blocks)
    assert all(torch.all(block.bn1.weight == 1) for block in model.checkpoint_blocks)
    plain = models.CifarResNet((1, 1, 1, 1), 4, zero_init_residual=False)
    assert all(torch.all(block.bn3.weight == 1) for block in plain.checkpoint_blocks)


def test_checkpointing_adapter_finds_the_resnet_blocks():
    from trainopt_core.checkpointing import block_sequence

    model = models.resnet_cifar((3, 4, 6, 3), width=4)
    assert list(block_sequence(model)) == list(model.checkpoint_blocks)


def test_gpt2_small_has_124m_parameters_with_tied_embeddings():
    with torch.device("meta"):
        model = models.gpt2_model()
    assert isinstance(model, CompactGPT2)
    # the LM head is the token embedding: no other vocabulary-sized matrix
    assert [name for name, p in model.named_parameters() if p.shape[0] >= 50257] == ["transformer.wte.weight"]
    assert model.config.padded_vocab_size == 50304 and model.config.vocab_size == 50257
    padding = (50304 - 50257) * 768  # rows that stay zero, never in a logit the loss sees
    assert models.count_parameters(model) - padding == 124_439_808  # GPT2LMHeadModel's GPT-2 small
    assert len(model.checkpoint_blocks) == 12 and model.config.n_embd == 768 and model.config.n_positions == 1024


def test_gpt2_model_trains_from_random_initialisation():
    model = models.gpt2_model(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8)
    tokens = torch.randint(0, 64, (2, 8))
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    # an untrained model predicts roughly uniformly over the vocabulary
    assert loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.1)
    assert model.transformer.wte.weight.grad is not None


def test_gpt2_flops_formula_agrees_with_flop_counter_within_10_percent():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = models.gpt2_model(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, dropout=0.0)
    tokens = torch.randint(0, 512, (2, 64))
    # FlopCounterMode counts CPU attention only as explicit matmuls: SDPA's math kernel
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(input_ids=tokens, labels=tokens).loss.backward()
    counted_per_token = counter.get_total_flops() / tokens.numel()
    formula_per_token = models.training_flops_per_token(model, seq_len=64)
    assert formula_per_token == pytest.approx(counted_per_token, rel=0.10)


def test_gpt2_flops_per_token_grow_with_sequence_length_by_the_attention_term():
    config = models.gpt2_config(n_layer=3, n_embd=48, n_head=4, vocab_size=100, n_positions=256)
    short, long = models.training_flops_per_token(config, 128), models.training_flops_per_token(config, 256)
    assert long - short == pytest.approx(12 * 3 * 48 * 128)


def test_resnet_training_flops_are_three_forward_passes_of_the_conv_and_linear_layers():
    model = models.resnet_cifar((1, 1, 1, 1), width=8)
    expected_forward = 0
    handles = []

    def count(module, inputs, output):
        nonlocal expected_forward
        if isinstance(module, nn.Conv2d):
            kernel = module.kernel_size[0] * module.kernel_size[1]
            height, width = output.shape[-2:]
            expected_forward += 2 * module.in_channels * module.out_channels * kernel * height * width
        else:
            expected_forward += 2 * module.in_features * module.out_features

    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            handles.append(module.register_forward_hook(count))
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, 32, 32))
    for handle in handles:
        handle.remove()
    model.train()
    assert models.training_flops_per_item(model, (3, 32, 32)) == pytest.approx(3 * expected_forward)


def test_flop_count_leaves_batch_norm_statistics_and_training_mode_alone():
    model = models.resnet_cifar((1, 1, 1, 1), width=4)
    before = model.bn1.running_mean.clone()
    models.training_flops_per_item(model)
    assert model.training
    assert torch.equal(model.bn1.running_mean, before)


def test_every_profile_names_sizes_for_both_model_families():
    for profile in models.PROFILES:
        for kind in models.MODEL_KINDS:
            assert models.model_size(kind, profile)
    assert models.model_size("gpt2", "paper")["seq_len"] == 1024
    assert models.model_size("resnet", "paper") == {"layers": (3, 4, 6, 3), "width": 64}


@pytest.mark.parametrize("call, argument", [
    (lambda: models.resnet_cifar((3, 4, 6)), "layers"),
    (lambda: models.resnet_cifar(width=0), "width"),
    (lambda: models.gpt2_config(n_embd=100, n_head=3), "n_head"),
    (lambda: models.gpt2_config(dropout=1.5), "dropout"),
    (lambda: models.model_size("vit", "quick"), "model_kind"),
    (lambda: models.model_size("gpt2", "huge"), "profile"),
    (lambda: models.training_flops_per_token(models.gpt2_config(n_layer=1, n_embd=8, n_head=2), 0), "seq_len"),
])
def test_bad_arguments_raise_value_errors_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


# ----------------------------------------------------------------------------- the compact GPT-2
def test_compact_gpt2_computes_what_gpt2lmheadmodel_does_with_the_same_weights():
    from trainopt_core.reproduction.gpt2 import from_hf

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf_model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=32,
                                          bos_token_id=0, eos_token_id=0, attn_implementation="eager"))
    ours = from_hf(hf_model).eval()
    hf_model.eval()
    tokens = torch.randint(0, 300, (3, 32))
    labels = tokens.clone()
    labels[0, 5:9] = -100  # not predicted, in both
    with torch.no_grad():
        theirs, mine = hf_model(input_ids=tokens, labels=labels), ours(tokens, labels=labels)
    assert mine.logits.shape == theirs.logits.shape == (3, 32, 300)
    torch.testing.assert_close(mine.logits, theirs.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.loss, theirs.loss, rtol=1e-5, atol=1e-6)


def test_compact_gpt2_gradients_match_gpt2lmheadmodel_in_training_without_dropout():
    from trainopt_core.reproduction.gpt2 import CONV1D_WEIGHTS, from_hf, to_hf

    torch.manual_seed(0)
    ours = models.gpt2_model(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=16, dropout=0.0)
    hf_model = to_hf(ours)
    tokens = torch.randint(0, 100, (2, 16))
    hf_model(input_ids=tokens, labels=tokens).loss.backward()
    ours(tokens, labels=tokens).loss.backward()
    theirs = dict(hf_model.named_parameters())
    for name, parameter in ours.named_parameters():
        grad = parameter.grad.t() if name.endswith(CONV1D_WEIGHTS) else parameter.grad
        if name == "transformer.wte.weight":
            assert torch.count_nonzero(grad[100:]) == 0  # the padded rows: no gradient
            grad = grad[:100]
        torch.testing.assert_close(grad, theirs[name].grad, rtol=1e-5, atol=1e-6)
    assert from_hf(hf_model).config == ours.config


def test_compact_gpt2_weights_round_trip_through_gpt2lmheadmodels_state_dict():
    from trainopt_core.reproduction.gpt2 import from_hf, hf_state_dict, load_hf_state_dict, to_hf

    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=2, n_embd=32, n_head=2, vocab_size=70, n_positions=16)
    hf_model = to_hf(model)
    state = hf_state_dict(model)
    assert set(state) == set(hf_model.state_dict())
    assert state["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # Conv1D: (in, out)
    assert state["lm_head.weight"].shape == state["transformer.wte.weight"].shape == (70, 32)
    back = from_hf(hf_model)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    untied = dict(state, **{"lm_head.weight": torch.zeros(70, 32)})
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_hf_state_dict(models.gpt2_model(n_layer=2, n_embd=32, n_head=2, vocab_size=70, n_positions=16), untied)


def test_compact_gpt2_is_initialised_as_gpt2lmheadmodel():
    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=8, n_embd=256, n_head=4, vocab_size=4000, n_positions=256)
    from transformers import GPT2Config, GPT2LMHeadModel

    theirs = GPT2LMHeadModel(GPT2Config(n_layer=8, n_embd=256, n_head=4, vocab_size=4000, n_positions=256,
                                        bos_token_id=0, eos_token_id=0)).state_dict()  # HF's own initialisation
    projection_std = 0.02 / (2 * 8) ** 0.5
    for name, tensor in model.state_dict().items():
        if name == "transformer.wte.weight":
            assert torch.count_nonzero(tensor[4000:]) == 0
            tensor = tensor[:4000]
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "transformer.ln_f.weight":
            assert torch.all(tensor == 1) and torch.all(theirs[name] == 1), name
        elif name.endswith("bias"):
            assert torch.count_nonzero(tensor) == 0 and torch.count_nonzero(theirs[name]) == 0, name
        else:
            expected = projection_std if name.endswith("c_proj.weight") else 0.02
            assert tensor.mean().abs() < 0.1 * expected, name
            assert tensor.std().item() == pytest.approx(expected, rel=0.05), name
            assert theirs[name].std().item() == pytest.approx(expected, rel=0.05), name


def test_compact_gpt2_checkpoints_its_blocks_and_trains_the_same():
    from trainopt_core.checkpointing import apply_activation_checkpointing, block_sequence, has_block_sequence

    tokens = torch.randint(0, 50, (2, 16))

    def loss_and_grads(checkpointed: bool):
        torch.manual_seed(0)
        model = models.gpt2_model(n_layer=4, n_embd=32, n_head=2, vocab_size=50, n_positions=16)  # dropout on
        if checkpointed:
            plan = apply_activation_checkpointing(model, "sqrt")
            assert plan.num_blocks == 4 and plan.segments == 2
        torch.manual_seed(1)
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    model = models.gpt2_model(n_layer=4, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    assert has_block_sequence(model) and block_sequence(model) == tuple(model.transformer.h)
    plain, checkpointed = loss_and_grads(False), loss_and_grads(True)
    assert torch.equal(plain[0], checkpointed[0])  # dropout replays its RNG in the recompute
    for a, b in zip(plain[1], checkpointed[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_padded_logits_never_enter_the_loss():
    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=1, n_embd=16, n_head=2, vocab_size=100, n_positions=8).eval()
    assert model.config.padded_vocab_size == 128
    tokens = torch.randint(0, 100, (2, 8))
    before = model(tokens, labels=tokens)
    with torch.no_grad():
        model.transformer.wte.weight[100:] = 50.0  # padded logits that would dominate any softmax
    after = model(tokens, labels=tokens)
    assert after.logits.shape == (2, 8, 100)
    torch.testing.assert_close(after.loss, before.loss)
    torch.testing.assert_close(after.logits, before.logits)


def test_the_one_call_loss_and_the_chunked_loss_give_the_same_loss_and_gradients():
    """CompactGPT2's default loss (one F.cross_entropy, the padded columns -inf) and the chunked
    one (loss_chunk_tokens) are the same function: same loss, same gradients, and the padded
    vocabulary rows get none."""
    import dataclasses

    from trainopt_core.reproduction.gpt2 import CompactGPT2

    torch.manual_seed(0)
    model = models.gpt2_model(n_layer=1, n_embd=16, n_head=2, vocab_size=100, n_positions=8)
    chunked = CompactGPT2(dataclasses.replace(model.config, loss_chunk_tokens=5))
    chunked.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 100, (3, 8))
    tokens[1, 4] = -100  # a label that is not predicted
    inputs = tokens.clamp(min=0)
    results = []
    for each in (model.eval(), chunked.eval()):
        loss = each(inputs, labels=tokens).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in each.named_parameters()}))
    assert model.config.loss_chunk_tokens is None
    torch.testing.assert_close(results[0][0], results[1][0])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], msg=name)
    assert results[0][1]["transformer.wte.weight"][100:].abs().max() == 0.0
    assert "vocab_padding" not in model.state_dict()  # not a weight: GPT2LMHeadModel's weights load as they are
    with pytest.raises(ValueError, match="loss_chunk_tokens"):
        dataclasses.replace(model.config, loss_chunk_tokens=0)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 10_000])
def test_the_chunked_loss_is_the_mean_cross_entropy_of_the_next_token(chunk_tokens):
    from trainopt_core.reproduction.gpt2 import next_token_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 9, 64, requires_grad=True)  # 40 real columns, 24 padding
    labels = torch.randint(0, 40, (2, 9))
    labels[1, 3] = -100
    expected = F.cross_entropy(logits[:, :-1, :40].reshape(-1, 40), labels[:, 1:].reshape(-1), ignore_index=-100)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    loss = next_token_loss(logits, labels, 40, chunk_tokens=chunk_tokens)
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)


def test_the_loss_keeps_no_fp32_logits_for_backward_under_bf16_autocast():
    """GPT2LMHeadModel keeps the upcast fp32 logits for the softmax's backward (6.1 GiB at the
    paper's batch); the chunked loss keeps the bf16 logits only, and recomputes each chunk."""
    from trainopt_core.reproduction.gpt2 import next_token_loss

    hidden = torch.randn(4, 64, 32, requires_grad=True)
    weight = torch.randn(256, 32, requires_grad=True)
    labels = torch.randint(0, 250, (4, 64))
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tensor.numel()))
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = F.linear(hidden, weight)
        start = len(saved)
        loss = next_token_loss(logits, labels, 250, chunk_tokens=64)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    fp32_saved = sum(n for dtype, n in saved[start:] if dtype == torch.float32)
    assert fp32_saved < 0.1 * logits.numel(), saved[start:]
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # HF's loss: the bf16 logits upcast, one cross-entropy
        reference = F.cross_entropy(F.linear(hidden, weight)[:, :-1, :250].float().reshape(-1, 250),
                                    labels[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, reference)


def test_gpt2_run_conditions_name_the_model_implementation():
    from trainopt_core.reproduction import gpt2, records
    from trainopt_core.reproduction.profiles import get_profile

    def conditions(task):
        return records.run_conditions(device="cpu", backend="torch", world_size=1, data_source="x", data_policy="standin",
                                      profile_settings=get_profile(task, "smoke").to_dict())

    assert conditions("wikitext2")["model_version"] == gpt2.MODEL_VERSION
    assert "model_version" not in conditions("cifar10")  # ResNet records made before keep their conditions
    before = {k: v for k, v in conditions("wikitext2").items() if k != "model_version"}  # made with GPT2LMHeadModel
    assert records.condition_differences({"conditions": before}, conditions("wikitext2")) == ["model_version"]


def test_a_process_that_builds_no_resnet_never_imports_torchvision():
    # torchvision costs every process ~2 s (it pulls in torch._dynamo); a GPT-2 rank, a notebook kernel
    # reading records or a CLI answering a bad flag builds no ResNet. Nor does the GPT-2 tokenizer, loaded
    # under the hub settings, need `datasets` (~1 s, pandas and pyarrow with it).
    code = textwrap.dedent("""
        import sys
        import trainopt_core, trainopt_core.reproduction.__main__
        from trainopt_core.reproduction import models
        from trainopt_core.reproduction.data import text
        models.build_model("gpt2", "smoke")
        with text._hub_settings(offline=True):
            pass
        print(sorted(name for name in ("torchvision", "datasets") if name in sys.modules))
    """)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
