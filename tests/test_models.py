import pytest
import torch
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models.resnet import Bottleneck, ResNet

from trainopt_core.reproduction import models


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
    assert model.lm_head.weight is model.transformer.wte.weight
    assert models.count_parameters(model) == pytest.approx(124.4e6, rel=0.002)
    assert len(model.transformer.h) == 12 and model.config.n_embd == 768 and model.config.n_positions == 1024
    assert model.config.use_cache is False
    assert model.config._attn_implementation == models.GPT2_ATTN_IMPLEMENTATION == "sdpa"


def test_gpt2_model_trains_from_random_initialisation():
    model = models.gpt2_model(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8)
    tokens = torch.randint(0, 64, (2, 8))
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    # an untrained model predicts roughly uniformly over the vocabulary
    assert loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.1)
    assert model.transformer.wte.weight.grad is not None


def test_gpt2_flops_formula_agrees_with_flop_counter_within_10_percent():
    config = models.gpt2_config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, dropout=0.0)
    config._attn_implementation = "eager"  # FlopCounterMode counts CPU attention only as explicit matmuls
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 512, (2, 64))
    with FlopCounterMode(display=False) as counter:
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
