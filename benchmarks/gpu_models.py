"""A larger user model for the GPU check: a small ResNet on 32x32 colour images.

``model = "gpu_models:resnet_gn"`` (with ``benchmarks/`` importable). GroupNorm instead of
BatchNorm, as federated training of ResNets usually does (BatchNorm's running statistics
are buffers that clients with different label mixes pull apart): a model without buffers is
also one the batched engine can stack over clients. It has the ``features`` / ``classifier``
parts the personalised strategies need. About 0.3 M parameters.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(8, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (a 1x1 convolution where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cout)
        self.shortcut = (nn.Sequential() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout)))

    def forward(self, x):
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNetGN(nn.Module):
    def __init__(self, channels: int, num_classes: int, widths=(32, 64, 128)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False),
                                   _norm(widths[0]), nn.ReLU()]
        cin = widths[0]
        for i, width in enumerate(widths):
            layers.append(BasicBlock(cin, width, 1 if i == 0 else 2))
            cin = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def resnet_gn(input_shape, num_classes):
    return ResNetGN(int(input_shape[0]), int(num_classes))
