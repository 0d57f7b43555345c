"""The CIFAR-stem bottleneck ResNet of paper §IV-A: torchvision's ResNet with a configurable width.

Kept apart from `models` so that torchvision (about 2 s to import, most of it the torch._dynamo its
ops pull in) is imported only by a process that builds a ResNet: `models.resnet_cifar` imports this
module when called, and `models.CifarResNet` resolves to this class on first use.
"""
from __future__ import annotations

from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet


class CifarResNet(ResNet):
    """torchvision's bottleneck ResNet with the CIFAR stem and a configurable base width.

    It is a `torchvision.models.ResNet` (same attributes conv1, bn1, relu, maxpool, layer1..layer4,
    avgpool, fc and the same forward), built with torchvision's own `_make_layer`; only the stem
    and the stage widths (width, 2·width, 4·width, 8·width planes) differ from `resnet50()`.
    """

    def __init__(self, layers=(3, 4, 6, 3), width: int = 64, num_classes: int = 10, zero_init_residual: bool = True):
        nn.Module.__init__(self)  # ResNet.__init__ hard-codes the 64-wide ImageNet stem
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = width
        self.dilation = 1
        self.groups = 1
        self.base_width = 64  # bottleneck inner width = planes (torchvision's width_per_group=64)
        # CIFAR stem (methodology): 32x32 inputs keep their resolution into layer1.
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        self.layer1 = self._make_layer(Bottleneck, width, layers[0])
        self.layer2 = self._make_layer(Bottleneck, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(Bottleneck, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(Bottleneck, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * Bottleneck.expansion, num_classes)
        # torchvision's initialisation
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)
        # torchvision's `zero_init_residual` (Goyal et al., 2017, the large-batch recipe the paper's
        # linear LR scaling comes from): each block's last BN starts at 0, so every residual branch
        # starts as the identity. Measured on the quick ResNet (clean image stand-in, 125 AdamW steps):
        # 10 % -> 23 % test accuracy after 1.4k samples, 84 % -> 96 % after 16k.
        if zero_init_residual:
            for block in self.checkpoint_blocks:
                nn.init.constant_(block.bn3.weight, 0)

    @property
    def checkpoint_blocks(self) -> tuple[nn.Module, ...]:
        """The 16 (for ResNet-50) bottleneck blocks layer1..layer4 in call order: the L of eq. 18.

        `forward` runs layer1..layer4 back to back, so a checkpoint segment may cross stages.
        """
        return tuple(block for stage in (self.layer1, self.layer2, self.layer3, self.layer4) for block in stage)


__all__ = ["CifarResNet"]
