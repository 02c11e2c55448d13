"""The model zoo for `make bench` (issue 19): public architectures, random weights, no downloads.

The CNNs are written here from their papers' published layer tables (ResNet-18, MobileNetV2,
EfficientNet-B0, ShuffleNetV2 x1.0, RegNetY-400MF); the transformers are built by the
`transformers` library from configs (BERT, GPT-2, ALBERT, DistilBERT, ViT); the recommendation
models are a DLRM with 26 embedding tables and a dot interaction, and the project's recsys
example with a dynamic batch. Batch norms get random statistics, so folding them is not a no-op.
Sizes are chosen so one eager call is tens of milliseconds on 2 CPU cores.

Each entry builds `ZooModel`: the eager module, example inputs and, for dynamic programs, the
`dynamic_shapes` to export with. Nobody tuned fxtune's passes against any of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

Inputs = tuple[Any, ...]


@dataclass
class ZooModel:
    name: str
    family: str
    module: nn.Module
    inputs: Inputs
    dynamic_shapes: Any = None  # torch.export's dynamic_shapes; None: static
    program: ExportedProgram | None = None  # where the model comes exported already

    def export(self) -> ExportedProgram:
        if self.program is not None:
            return self.program
        return torch.export.export(
            self.module, self.inputs, dynamic_shapes=self.dynamic_shapes, strict=False
        )


def randomize_batch_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fresh models have identity batch norms (mean 0, var 1), which would hide a bad fold."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
    return model.eval()


def _conv_bn(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(c_out)]


def _images(batch: int, size: int) -> Inputs:
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)),)


# ---------------------------------------------------------------------------------------------
# CNNs


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(c_in, c_out, 3, stride), nn.ReLU(), *_conv_bn(c_out, c_out, 3)
        )
        self.down = (
            nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        c = 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(c, width, stride), BasicBlock(width, width, 1)]
            c = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block, and with `se` and SiLU EfficientNet's MBConv."""

    def __init__(
        self, c_in: int, c_out: int, stride: int, expand: int, k: int = 3, se: bool = False
    ) -> None:
        super().__init__()
        act: type[nn.Module] = nn.SiLU if se else nn.ReLU6
        mid = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(c_in, mid, 1), act()]
        layers += [*_conv_bn(mid, mid, k, stride, groups=mid), act()]
        self.expand = nn.Sequential(*layers)
        squeeze = max(1, c_in // 4)
        self.se = (
            nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Conv2d(mid, squeeze, 1),
                nn.SiLU(),
                nn.Conv2d(squeeze, mid, 1),
                nn.Sigmoid(),
            )
            if se
            else None
        )
        self.project = nn.Sequential(*_conv_bn(mid, c_out, 1))
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(x)
        if self.se is not None:
            y = y * self.se(y)
        y = self.project(y)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    # (expand, channels, repeats, stride)
    TABLE = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1))
    TABLE += ((6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU6()]
        c = 32
        for t, width, n, s in self.TABLE:
            for i in range(n):
                layers.append(InvertedResidual(c, width, s if i == 0 else 1, t))
                c = width
        layers += [*_conv_bn(c, 1280, 1), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


class EfficientNetB0(nn.Module):
    # (expand, kernel, stride, channels, repeats)
    TABLE = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3))
    TABLE += ((6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.SiLU()]
        c = 32
        for t, k, s, width, n in self.TABLE:
            for i in range(n):
                layers.append(InvertedResidual(c, width, s if i == 0 else 1, t, k, se=True))
                c = width
        layers += [*_conv_bn(c, 1280, 1), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def _channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = c_out // 2
        if stride > 1:
            self.left = nn.Sequential(
                *_conv_bn(c_in, c_in, 3, stride, groups=c_in), *_conv_bn(c_in, half, 1), nn.ReLU()
            )
        right_in = c_in if stride > 1 else half
        self.right = nn.Sequential(
            *_conv_bn(right_in, half, 1),
            nn.ReLU(),
            *_conv_bn(half, half, 3, stride, groups=half),
            *_conv_bn(half, half, 1),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.right(b)), dim=1)
        else:
            out = torch.cat((self.left(x), self.right(x)), dim=1)
        return _channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 24, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        c = 24
        for width, repeats in ((116, 4), (232, 8), (464, 4)):
            for i in range(repeats):
                layers.append(ShuffleUnit(c, width, 2 if i == 0 else 1))
                c = width
        layers += [*_conv_bn(c, 1024, 1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1024, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


class RegNetYBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, group_width: int = 8) -> None:
        super().__init__()
        squeeze = max(1, c_in // 4)
        self.a = nn.Sequential(*_conv_bn(c_in, c_out, 1), nn.ReLU())
        self.b = nn.Sequential(*_conv_bn(c_out, c_out, 3, stride, c_out // group_width), nn.ReLU())
        self.se = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(c_out, squeeze, 1),
            nn.ReLU(),
            nn.Conv2d(squeeze, c_out, 1),
            nn.Sigmoid(),
        )
        self.c = nn.Sequential(*_conv_bn(c_out, c_out, 1))
        self.down = (
            nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.a(x))
        y = self.c(y * self.se(y))
        return torch.relu(y + self.down(x))


class RegNetY400MF(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU()]
        c = 32
        for width, depth in ((48, 1), (104, 3), (208, 6), (440, 6)):
            for i in range(depth):
                layers.append(RegNetYBlock(c, width, 2 if i == 0 else 1))
                c = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


def _cnn(name: str, cls: type[nn.Module], batch: int = 2, size: int = 160) -> ZooModel:
    torch.manual_seed(0)
    return ZooModel(name, "cnn", randomize_batch_norms(cls()), _images(batch, size))


# ---------------------------------------------------------------------------------------------
# transformers, from configs


class Outputs(nn.Module):
    """transformers returns ModelOutput objects; a `.pt2` wants plain tensors."""

    def __init__(self, model: nn.Module, key: str, *names: str) -> None:
        super().__init__()
        self.model = model
        self.key = key
        self.names = names or ("input_ids", "attention_mask")

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.names, args, strict=True))
        return self.model(**kwargs, return_dict=True)[self.key]


def _ids(batch: int, seq: int, vocab: int) -> Inputs:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return ids, torch.ones(batch, seq, dtype=torch.long)


def _text(name: str, model: nn.Module, vocab: int, batch: int = 2, seq: int = 128) -> ZooModel:
    return ZooModel(
        name, "transformer", Outputs(model, "last_hidden_state").eval(), _ids(batch, seq, vocab)
    )


def bert() -> ZooModel:
    import transformers as tf

    cfg = tf.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    return _text("bert_mini", tf.BertModel(cfg), cfg.vocab_size)


def gpt2() -> ZooModel:
    import transformers as tf

    cfg = tf.GPT2Config(n_layer=2, n_embd=512, n_head=8, n_positions=256, use_cache=False)
    return _text("gpt2_2layer", tf.GPT2Model(cfg), cfg.vocab_size)


def albert() -> ZooModel:
    import transformers as tf

    cfg = tf.AlbertConfig(
        embedding_size=128,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        intermediate_size=1536,
    )
    return _text("albert_small", tf.AlbertModel(cfg), cfg.vocab_size)


def distilbert_dynamic() -> ZooModel:
    """DistilBERT with a dynamic batch (2 to 64), as a served text model is exported."""
    import transformers as tf

    cfg = tf.DistilBertConfig(n_layers=3, dim=384, n_heads=6, hidden_dim=1536)
    zoo = _text("distilbert_dyn", tf.DistilBertModel(cfg), cfg.vocab_size, batch=4, seq=64)
    batch = Dim("batch", min=2, max=64)
    zoo.dynamic_shapes = {"args": ({0: batch}, {0: batch})}
    return zoo


def vit() -> ZooModel:
    import transformers as tf

    cfg = tf.ViTConfig(
        hidden_size=192,
        num_hidden_layers=6,
        num_attention_heads=3,
        intermediate_size=768,
        image_size=160,
        patch_size=16,
    )
    module = Outputs(tf.ViTModel(cfg), "last_hidden_state", "pixel_values").eval()
    return ZooModel("vit_tiny", "transformer", module, _images(2, 160))


# ---------------------------------------------------------------------------------------------
# recommendation


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP, 26 embedding tables, pairwise dot interaction."""

    def __init__(self, tables: int = 26, rows: int = 2000, dim: int = 32, dense: int = 13) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables)
        )
        self.bottom = nn.Sequential(
            nn.Linear(dense, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, dim)
        )
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(
            nn.Linear(pairs + dim, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )
        i, j = torch.tril_indices(tables + 1, tables + 1, offset=-1)
        self.register_buffer("pair_i", i, persistent=False)
        self.register_buffer("pair_j", j, persistent=False)

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [
            bag(idx, off) for bag, idx, off in zip(self.embeddings, indices, offsets, strict=True)
        ]
        feats = torch.stack([x, *pooled], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2))[:, self.pair_i, self.pair_j]
        return torch.sigmoid(self.top(torch.cat([x, dots], dim=1)))


def dlrm(batch: int = 512, tables: int = 26, per_bag: int = 4) -> ZooModel:
    torch.manual_seed(0)
    model = DLRM(tables=tables).eval()
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, 13, generator=gen)
    indices = torch.randint(0, 2000, (tables, batch * per_bag), generator=gen)
    offsets = (torch.arange(batch) * per_bag).expand(tables, batch).contiguous()
    return ZooModel("dlrm_26tables", "recsys", model, (dense, indices, offsets))


def recsys_dynamic() -> ZooModel:
    from examples.dynamic import recsys

    model, program, make = recsys(batch=256, num_sparse=16)
    return ZooModel("recsys_dyn", "recsys", model, make(256, 0), program=program)


ZOO: dict[str, Callable[[], ZooModel]] = {
    "resnet18": lambda: _cnn("resnet18", ResNet18),
    "mobilenet_v2": lambda: _cnn("mobilenet_v2", MobileNetV2),
    "efficientnet_b0": lambda: _cnn("efficientnet_b0", EfficientNetB0),
    "shufflenet_v2": lambda: _cnn("shufflenet_v2", ShuffleNetV2),
    "regnet_y_400mf": lambda: _cnn("regnet_y_400mf", RegNetY400MF),
    "bert_mini": bert,
    "gpt2_2layer": gpt2,
    "albert_small": albert,
    "distilbert_dyn": distilbert_dynamic,
    "vit_tiny": vit,
    "dlrm_26tables": dlrm,
    "recsys_dyn": recsys_dynamic,
}


def exported(name: str) -> ExportedProgram:
    """The zoo model `name` as a user exports it (weights seeded, so every build is the same)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return ZOO[name]().export()
