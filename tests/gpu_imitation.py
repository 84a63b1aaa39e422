"""GPU conditions imitated on a CPU machine (tests/unit/test_gpu_paths.py).

`accelerator_draws` plays a CUDA node for torch's random draws. There, the tensors eagle3 samples
live on the GPU and a generator made without naming a device is the host's, which CUDA refuses
("Expected a 'cuda' device type for generator but found 'cpu'"). Here every tensor is on the CPU,
so the fixture marks each generator made without a device as the host's and refuses it in
`torch.multinomial` / `torch.rand`, and refuses a `torch.rand` whose tensor is made on another
device than its generator (no `device=`: the host).

`fake_cuda(monkeypatch, n)` makes torch report n CUDA devices without touching any (device counts,
RNG states per device), for the code paths that only ask.
"""

from __future__ import annotations

import torch


class AcceleratorDraws:
    def __init__(self, monkeypatch):
        self.host: set[int] = set()
        self.keep: list[torch.Generator] = []  # ids stay unique while the test runs
        self.draws = 0
        real_gen, real_multinomial, real_rand = torch.Generator, torch.multinomial, torch.rand

        def generator(device=None):
            g = real_gen(device="cpu" if device is None else device)
            self.keep.append(g)
            if device is None:
                self.host.add(id(g))
            return g

        def refuse(g, where: str):
            if g is not None and id(g) in self.host:
                raise RuntimeError(f"Expected a 'cuda' device type for generator but found 'cpu' ({where})")

        def multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
            refuse(generator, "multinomial")
            self.draws += 1
            return real_multinomial(input, num_samples, replacement, generator=generator)

        def rand(*size, generator=None, device=None, **kw):
            refuse(generator, "rand")
            if generator is not None and device is None:
                raise RuntimeError("Expected a 'cpu' device type for generator but found 'cuda' (rand on the host)")
            self.draws += 1
            return real_rand(*size, generator=generator, device=device, **kw)

        monkeypatch.setattr(torch, "Generator", generator)
        monkeypatch.setattr(torch, "multinomial", multinomial)
        monkeypatch.setattr(torch, "rand", rand)


class FakeCuda:
    """torch.cuda as on a node with `n` GPUs, for code that asks about devices and RNG states."""

    def __init__(self, monkeypatch, n: int):
        self.n = n
        self.states: dict[int, torch.Tensor] = {}
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.n)

        def set_state(state, device="cuda"):
            i = torch.device(device).index if not isinstance(device, int) else device
            i = 0 if i is None else i
            if i >= self.n:  # what torch's default_generators[i] raises
                raise IndexError("list index out of range")
            self.states[i] = state.clone()

        def get_all():
            return [torch.full((8,), i, dtype=torch.uint8) for i in range(self.n)]

        for mod in (torch.cuda, torch.cuda.random):
            monkeypatch.setattr(mod, "set_rng_state", set_state)
            monkeypatch.setattr(mod, "get_rng_state_all", get_all)


def fake_cuda(monkeypatch, n: int) -> FakeCuda:
    return FakeCuda(monkeypatch, n)
