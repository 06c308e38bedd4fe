"""What a training step returns on each rank, and the one check against the single process.

Every step entry point (a pipeline's `train_step`, the GPT's `gpt_train_step`, torch's twin
`torch_train_step`, the blocking runner and chapter 10's hand-written orchestrator) returns one
`StepResult` per rank, never a tuple whose length depends on flags. `check_against_reference`
gathers the ranks' results and asserts they equal one process running the whole model: one
loss, and every gradient (and parameter, after optimizer steps) under the monolith's names.

    results = run_train_step(cluster, "1f1b", 4, 8, cfg)    # [StepResult or None] per rank
    agreed = check_against_reference(results, Recipe(cfg, batch_size=16).first_step())
    print(agreed)                                           # 1 loss, 8 gradients, max |diff| 0

Introduced in chapter 10; every later chapter's "same as one process" check goes through it.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepResult:
    """One rank's result of a training step.

    loss:   the step's loss on the rank that computes it (a pipeline's last stage), else None.
    grads:  this rank's gradients under the single-process model's parameter names.
    stats:  what else a chapter's runner measured, under its own names (buckets, logits, ...).
    times:  seconds per step when the step was timed, else (): on the device's clock under the
            trainer (`pipelib.trainer`: virtual on a simulated device, wall on real ones).
    losses: one float per optimizer step of a training run (on the loss rank), else ().
    params: this rank's parameters after the run's optimizer steps, when it took any.

    Measured by the trainer's `Device.measure()` scopes, one meaning each:
    peak_bytes: the most memory this rank's tracker held during the run (all categories).
    bytes_sent: payload bytes this rank sent, one entry per step.
    """

    loss: object = None
    grads: Mapping[str, object] = field(default_factory=dict)
    stats: Mapping[str, object] = field(default_factory=dict)
    times: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    params: Mapping[str, object] | None = None
    peak_bytes: int | None = None
    bytes_sent: tuple[int, ...] = ()


@dataclass(frozen=True)
class Agreement:
    """What `check_against_reference` checked: the gathered loss and tensors, and how close."""

    loss: object
    grads: dict
    params: dict | None
    num_tensors: int
    max_abs_diff: float
    num_losses: int = 0  # per-step losses checked (a training run)

    def __str__(self) -> str:
        what = f"{len(self.grads)} gradients" + (f" and {len(self.params)} parameters" if self.params else "")
        if self.num_losses:
            what = f"{self.num_losses} step losses, {what}"
        loss = "" if self.loss is None else f"loss {float(self.loss):.4f}, "
        return f"{loss}{what} equal the single process's (max |diff| {self.max_abs_diff:.1e})"


def gather(results: Sequence[StepResult | None], key: str = "grads", *,
           shared: Collection[str] | bool = ()) -> dict:
    """One dict {name: tensor} from every rank's `key` ("grads" or "params").

    Each name comes from one rank, except names in `shared` (True: any name), such as a tied
    weight or data parallelism's replicas: their copies must be equal on every rank that holds
    them. An AssertionError names the tensor and the ranks otherwise."""
    import torch

    out, owner = {}, {}
    for rank, r in enumerate(results):
        for name, t in ((getattr(r, key, None) or {}) if r is not None else {}).items():
            if name in out:
                assert shared is True or name in shared, (
                    f"{name} returned by rank {owner[name]} and rank {rank}; pass shared= if "
                    f"it is replicated on purpose (a tied weight, data parallelism)")
                where = f"{name} differs between rank {owner[name]} and rank {rank}"
                torch.testing.assert_close(t.cpu(), out[name].cpu(), msg=lambda e, w=where: f"{w}: {e}")
                continue
            out[name], owner[name] = t, rank
    return out


def _close(got: dict, want: Mapping, what: str, exact: bool, rtol, atol) -> float:
    import torch

    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, (f"{what}: missing {missing}, not in the reference {extra}")
    worst = 0.0
    for name, ref in want.items():
        t, ref = got[name].cpu(), ref.cpu()  # a GPU rank's or reference's tensors, compared on the CPU
        if exact:
            assert torch.equal(t, ref), f"{what} {name}: not bit for bit equal"
        else:
            torch.testing.assert_close(t, ref, rtol=rtol, atol=atol, msg=lambda e, n=name: f"{what} {n}: {e}")
        if t.numel():
            worst = max(worst, (t.double() - ref.double()).abs().max().item())
    return worst


def check_against_reference(results: Sequence[StepResult | None], ref_loss=None,
                            ref_grads: Mapping | None = None, *, ref_params: Mapping | None = None,
                            ref_losses: Sequence[float] | None = None,
                            shared: Collection[str] | bool = (), exact: bool = False,
                            rtol: float | None = None, atol: float | None = None) -> Agreement:
    """Assert the ranks' results equal the single-process reference; return what was checked.

    The reference is a `StepResult` (`Recipe.reference()` or `Recipe.first_step()`), whose loss, grads,
    params and per-step losses are all checked, or its parts given one by one. With
    `ref_losses`, the loss rank's `losses` (one per step) equal them too.

    `results` is a list per rank (None for a rank with no work). With `ref_loss`, exactly one
    rank returns a loss and it equals `ref_loss`. With `ref_grads` ({name: gradient}), the
    gathered gradients have exactly the reference's names and values; so do the parameters
    with `ref_params`. A name may come from several ranks only if in `shared` (True: any),
    with equal copies (`gather`). `exact=True` demands bitwise equality, else `torch.testing.assert_close`
    (with `rtol`/`atol` when given, else its defaults for the dtype).
    """
    import torch

    if isinstance(ref_loss, StepResult):
        ref = ref_loss
        ref_loss, ref_grads = ref.loss, ref.grads if ref_grads is None else ref_grads
        ref_params = ref.params if ref_params is None else ref_params
        ref_losses = (ref.losses or None) if ref_losses is None else ref_losses
    if not any(r is not None for r in results):
        raise ValueError("no rank returned a result: did the step run on ranks outside the group?")
    losses = [r.loss for r in results if r is not None and r.loss is not None]
    worst = 0.0
    if ref_loss is not None:
        assert len(losses) == 1, f"expected one rank to return the loss, got {len(losses)}"
        ref = _as_tensor(ref_loss)
        got = _as_tensor(losses[0]).to(ref.dtype)
        worst = max(worst, _close({"loss": got}, {"loss": ref}, "loss", exact, rtol, atol))
    if ref_losses is not None:
        got = [r.losses for r in results if r is not None and r.losses]
        assert len(got) == 1, f"expected one rank to return the per-step losses, got {len(got)}"
        assert len(got[0]) == len(ref_losses), (
            f"losses: {len(got[0])} steps, the reference has {len(ref_losses)}")
        worst = max(worst, _close({"losses": torch.tensor(got[0], dtype=torch.float64)},
                                  {"losses": torch.tensor(list(ref_losses), dtype=torch.float64)},
                                  "per-step", exact, rtol, atol))
    grads = gather(results, "grads", shared=shared)
    n = 0
    if ref_grads is not None:
        worst = max(worst, _close(grads, ref_grads, "gradient", exact, rtol, atol))
        n += len(ref_grads)
    params = gather(results, "params", shared=shared) if ref_params is not None else None
    if ref_params is not None:
        worst = max(worst, _close(params, ref_params, "parameter", exact, rtol, atol))
        n += len(ref_params)
    return Agreement(losses[0] if losses else None, grads, params, n, worst,
                     len(ref_losses) if ref_losses is not None else 0)


def _as_tensor(x):
    """A loss as a tensor: a Python float stays float64 (torch.as_tensor would round it to fp32)."""
    import torch

    return torch.tensor(x, dtype=torch.float64) if isinstance(x, float) else torch.as_tensor(x)
