"""The built-in CNN's clients stacked as grouped convolutions: the stacked way that wins on a CPU.

On a CPU the built-in CNN above ``batched.CPU_STACKED_MACS`` (the CNN on 16x16 or 28x28
images) loses when its clients are stacked with ``vmap`` (``batched._torch_stacked``'s default
forward pass). Written instead as one grouped convolution over the clients' inputs side by
side on the channel axis, in channels-last memory format, in programs of a few clients, it
wins (``benchmarks/bench_conv_stacking.py``, docs/operations/performance.md): this module is
that forward pass, which ``batched._torch_stacked`` runs in place of ``vmap`` (the same
minibatches, padding, losses and optimizer step), and the rule of when it does.

Each client's slice of a grouped convolution is its own convolution, so the results equal the
per-client path up to floating-point rounding; only SGD (with momentum and weight decay) is
taken: Adam turns that rounding into larger differences (``docs``: "Results equal ..."), and a
run that trained one client at a time keeps doing so with Adam.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from fedcluster_app.core.config import TrainConfig
from fedcluster_app.core.models import CNN, ModelSpec

#: clients per grouped program: the cost of a grouped convolution per client grows with the
#: clients in it (one program of 50 took 1.13-1.31x one by one). On the CNN on 1x28x28
#: (benchmarks/bench_conv_stacking.py --program-clients, 2 cores of an AMD EPYC), programs of
#: 5 took 0.56-0.77x one by one at 10 clients and 0.59-0.71x at 50 (of 2: 0.57-0.64 / 0.46-0.59,
#: of 10: 0.59-0.87 / 0.72-0.73, of 20: 0.77 / 0.84; of 1, channels-last alone: 1.00 / 0.99);
#: on 1x16x16, 0.50 / 0.53
PROGRAM_CLIENTS = 5


def applies(spec: ModelSpec, device: str, cfg: TrainConfig) -> bool:
    """Whether jobs of this model, device and training config train grouped (when ``vmap``
    stacking does not pay): the built-in CNN on a CPU, trained with SGD. A rule of the model,
    the device and the config, never a timing, so a seeded run trains the same way on every
    machine."""
    return spec.kind == "cnn" and str(device).startswith("cpu") and cfg.optimizer == "sgd"


def job_losses(model: CNN, params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
               wb: torch.Tensor | None, nb: torch.Tensor | None) -> torch.Tensor:
    """Each job's loss on its minibatch, ``(jobs,)``: ``params`` are the jobs' stacked
    parameters, ``xb`` (jobs, batch, C, H, W) and ``yb`` (jobs, batch) their minibatches;
    ``wb`` (jobs, batch) weights the per-sample losses, summed and divided by ``nb`` (jobs,)
    (sample weights, and zeros on a shorter minibatch's padding), else each job's mean."""
    J, B = xb.shape[:2]
    x = xb.transpose(0, 1).reshape(B, J * xb.shape[2], *xb.shape[3:])    # (B, J x C, H, W)
    logits = grouped_forward(model, params, x.contiguous(memory_format=torch.channels_last), J)
    per_sample = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(J, B)
    if wb is None:
        return per_sample.mean(1)
    return (wb * per_sample).sum(1) / nb


def grouped_forward(model: CNN, params: dict[str, torch.Tensor], x: torch.Tensor, J: int,
                    channels_last: bool = True) -> torch.Tensor:
    """The built-in CNN's forward pass for J clients at once: ``x`` is (batch, J x channels,
    H, W), client j's channels the j-th block; a convolution is one grouped convolution of the
    J weights (``channels_last``: in that memory format, as ``x`` should be), a linear layer
    one batched product; returns the logits (J, batch, classes)."""
    layers = [(f"features.{i}", m) for i, m in enumerate(model.features)]
    layers.append(("classifier", model.classifier))
    h = x
    for name, layer in layers:
        if isinstance(layer, torch.nn.Conv2d):
            w = params[f"{name}.weight"].flatten(0, 1)        # (J x out, in, kh, kw)
            if channels_last:
                w = w.contiguous(memory_format=torch.channels_last)
            h = F.conv2d(h, w, params[f"{name}.bias"].flatten(), layer.stride, layer.padding,
                         layer.dilation, groups=J)
        elif isinstance(layer, torch.nn.ReLU):
            h = F.relu(h)
        elif isinstance(layer, torch.nn.MaxPool2d):
            h = F.max_pool2d(h, layer.kernel_size, layer.stride, layer.padding)
        elif isinstance(layer, torch.nn.Flatten):             # client j's channels are a block
            h = h.reshape(h.shape[0], J, -1).transpose(0, 1)   # (J, batch, features)
        elif isinstance(layer, torch.nn.Linear):
            h = torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), h,
                              params[f"{name}.weight"].transpose(1, 2))
        else:
            raise ValueError(f"grouped convolutions: no stacked form for {type(layer).__name__}")
    return h
