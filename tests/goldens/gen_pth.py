"""Writes the PyTorch weight files that tests/test_torch_weights.cpp reads, under
tests/goldens/pth/, and tests/goldens/pth.safetensors with each model's input and logits.

Every file is written by Debian's torch.save (PyTorch 1.13), from torchvision's own classes
with random weights, so their parameter names and structure are torchvision's. To keep the
committed files small the networks are narrow: ResNets and VGG have their channels divided
(the engine's --width matches them), the ViT is torchvision's VisionTransformer with
vit_b_16's patch size at a small width and depth. Logits are computed in float64.

Beside the four models, files that exercise the reader: float16/bfloat16 storages, strided
views and storage offsets, a state dict saved as parameters under "module." inside a dict,
deflated entries, a big-endian byte order, zip64 records; and tampered files that must be
refused: a pickle calling os.system, a whole pickled module, a TorchScript archive, a storage shorter than its
tensor, strides reaching past the storage, a view repeating elements, the legacy (pre-1.6)
format.
Run: /usr/bin/python3 tests/goldens/gen_pth.py
"""
import collections
import io
import os
import zipfile

import torch
import torchvision

from fixture_io import save, seeded

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pth")
CLASSES = 10


def narrow(model, divisor):
    """Divides the channels of every convolution, BatchNorm and hidden linear layer of a
    torchvision CNN by `divisor`, keeping its modules, names and forward."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Conv2d):
                c_in = child.in_channels if child.in_channels == 3 else child.in_channels // divisor
                new = torch.nn.Conv2d(c_in, child.out_channels // divisor, child.kernel_size, child.stride,
                                      child.padding, bias=child.bias is not None)
            elif isinstance(child, torch.nn.BatchNorm2d):
                new = torch.nn.BatchNorm2d(child.num_features // divisor)
            elif isinstance(child, torch.nn.Linear):
                c_out = child.out_features if child.out_features == CLASSES else child.out_features // divisor
                new = torch.nn.Linear(child.in_features // divisor, c_out)
            else:
                continue
            setattr(parent, name, new)
    return model


def randomise(model, gen):
    """Random weights everywhere, BatchNorm's affine parameters and running statistics and
    LayerNorm's included (their defaults, ones and zeros, would hide a misplaced tensor)."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                t.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
            elif name.endswith("running_var") or (t.dim() == 1 and name.endswith("weight")):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif t.dim() <= 1:
                t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
            else:
                fan_in = t[0].numel()
                t.copy_(torch.randn(t.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
    return model.eval()


def logits(model, x):
    with torch.no_grad():
        return model.double()(x.double()).float()


def models():
    gen = seeded(37)
    out = {}
    out["resnet18"] = (randomise(narrow(torchvision.models.resnet18(num_classes=CLASSES), 16), gen), 32)
    out["resnet50"] = (randomise(narrow(torchvision.models.resnet50(num_classes=CLASSES), 16), gen), 32)
    vgg = narrow(torchvision.models.vgg11_bn(num_classes=CLASSES), 32)
    out["vgg11_bn"] = (randomise(vgg, gen), 32)
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                                               hidden_dim=32, mlp_dim=64, num_classes=CLASSES)
    out["vit_b_16"] = (randomise(vit, gen), 32)
    return out


def entry(name):
    """A zip entry dated as torch.save dates its own, so that the files are reproducible."""
    return zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))


def rewrite_zip(source, target, change_entry=lambda name, data: data, extra=(), compression=zipfile.ZIP_STORED):
    """Copies a zip archive entry by entry, each through change_entry, adding `extra`."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            zout.writestr(entry(info.filename), change_entry(info.filename, zin.read(info.filename)),
                          compress_type=compression)
        for name, data in extra:
            zout.writestr(entry(name), data, compress_type=compression)


def big_endian(name, data):
    """A float32 storage's bytes swapped (the ViT's storages are all float32)."""
    if "/data/" not in name:
        return data
    return b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))


def write_zip64(source, target):
    """The same archive with zip64 records for every entry and the directory, as a file
    over 4 GiB would have them: zipfile writes them for whatever exceeds its limit."""
    limit = zipfile.ZIP64_LIMIT
    zipfile.ZIP64_LIMIT = 0
    try:
        rewrite_zip(source, target)
    finally:
        zipfile.ZIP64_LIMIT = limit


def torch_like_zip(target, pickle_bytes):
    """A torch.save-shaped archive around a hand-written pickle."""
    with zipfile.ZipFile(target, "w") as z:
        z.writestr(entry("archive/data.pkl"), pickle_bytes)
        z.writestr(entry("archive/version"), "3\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)  # the pickled module's initialisation
    fixtures = {}
    gen = seeded(38)
    for name, (model, size) in models().items():
        x = torch.randn(2, 3, size, size, generator=gen)
        torch.save(model.state_dict(), os.path.join(OUT, name + ".pth"))
        fixtures[name + ".input"] = x
        fixtures[name + ".logits"] = logits(model, x)
        model.float()

    resnet, _ = models()["resnet18"]  # the same weights again, in float32
    x = fixtures["resnet18.input"]

    # float16 and bfloat16 storages, a transposed view, a view at an offset into a larger
    # storage; the logits are those of the weights as rounded.
    state = collections.OrderedDict()
    for i, (name, t) in enumerate(resnet.state_dict().items()):
        if t.is_floating_point():
            t = t.half() if i % 2 == 0 else t.bfloat16()
        state[name] = t
    state["fc.weight"] = state["fc.weight"].float().t().contiguous().t()
    conv = state["conv1.weight"].float()
    backing = torch.cat([torch.randn(100, generator=gen), conv.flatten()])
    state["conv1.weight"] = backing[100:].view(conv.shape)
    torch.save(state, os.path.join(OUT, "resnet18_mixed.pth"))
    rounded = torchvision.models.resnet18(num_classes=CLASSES)
    narrow(rounded, 16).load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    fixtures["resnet18_mixed.logits"] = logits(rounded.eval(), x)

    # A training script's checkpoint: the model wrapped in DataParallel (names under
    # "module."), saved as parameters beside its buffers, with an epoch and a learning rate.
    wrapped = torch.nn.DataParallel(resnet)
    weights = collections.OrderedDict(wrapped.named_parameters())
    weights.update(wrapped.named_buffers())
    torch.save({"epoch": 3, "lr": 0.1, "model": weights, "note": "random"}, os.path.join(OUT, "resnet18_nested.pth"))

    # The ViT's archive deflated, big-endian, and with zip64 records.
    vit_path = os.path.join(OUT, "vit_b_16.pth")
    rewrite_zip(vit_path, os.path.join(OUT, "vit_b_16_deflated.pth"), compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(vit_path) as z:
        prefix = z.namelist()[0].split("/")[0]
    rewrite_zip(vit_path, os.path.join(OUT, "vit_b_16_big_endian.pth"), big_endian,
                extra=[(prefix + "/byteorder", "big")])
    write_zip64(vit_path, os.path.join(OUT, "vit_b_16_zip64.pth"))

    # Tampered files.
    torch_like_zip(os.path.join(OUT, "os_system.pth"),
                   b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    torch.save(torch.nn.Linear(2, 2), os.path.join(OUT, "module.pth"))
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(OUT, "torchscript.pth"))
    small = os.path.join(OUT, "short_storage.pth")
    torch.save({"w": torch.randn(4, 4, generator=gen)}, small)
    data = io.BytesIO()
    rewrite_zip(small, data, lambda name, d: d[:32] if name.endswith("/data/0") else d)
    with open(small, "wb") as f:
        f.write(data.getvalue())
    # A pickle whose strides reach past its storage: (4, 4) with stride (5, 1) on 16 elements.
    beyond = os.path.join(OUT, "view_beyond_storage.pth")
    torch.save({"w": torch.randn(4, 4, generator=gen)}, beyond)
    data = io.BytesIO()
    rewrite_zip(beyond, data, lambda name, d: d.replace(b"K\x04K\x01\x86", b"K\x05K\x01\x86", 1)
                if name.endswith("data.pkl") else d)
    with open(beyond, "wb") as f:
        f.write(data.getvalue())
    # A view repeating its storage's 3 elements a thousand times (stride 0).
    torch.save({"w": torch.randn(3, generator=gen).expand(1000, 3)}, os.path.join(OUT, "expanded.pth"))
    # The legacy format keys storages by object id, so this one file differs from run to run.
    torch.save({"w": torch.randn(2, 2, generator=gen)}, os.path.join(OUT, "legacy.pth"),
               _use_new_zipfile_serialization=False)

    save("pth", fixtures)
    for name in sorted(os.listdir(OUT)):
        print(f"  {name}: {os.path.getsize(os.path.join(OUT, name))} bytes")


if __name__ == "__main__":
    main()
