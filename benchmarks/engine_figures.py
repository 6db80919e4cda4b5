"""Figures derived from the engine benchmark's timed runs: rates, ratios, the per-batch summary.

``derive`` adds to every result row: new tokens/s, ms per decode step (whole batch, encoder
time amortised), achieved GFLOP/s and the fraction of the fp32 matmul peak, and the ratios to
the best CTranslate2 thread split of the same precision and to HF ``generate`` with KV cache.
``summary`` condenses the rows per batch size.

The rounds run every engine once each, interleaved, so round *i* of two engines saw the same
state of the machine. Each ratio also comes per round (``ratio_to_ctranslate2_rounds``: the peer's
time over ours in that round) and as the range over the rounds: on a VM whose speed drifts
during a run, the median ratio alone hides how far one round's comparison can be from another's.
"""

from __future__ import annotations

from typing import Any

from benchmarks.engine_settings import EngineSettings

PRECISIONS = ("fp32", "fp16", "int8")
HF_REFERENCE = "hf-generate-kv"
HF_FP16_REFERENCE = "hf-generate-kv-fp16"  # fp16 rows' HF peer, when measured (CUDA)


def derive(rows: list[dict[str, Any]], settings: EngineSettings, peak_gflops: float) -> None:
    """tokens/s, ms per step, GFLOP/s, fraction of peak and ratios, per row (in place)."""
    flops = settings.shape.flops_per_sequence(settings.source_length, settings.new_tokens)
    for row in rows:
        _rates(row, settings.new_tokens, flops, peak_gflops)
    for batch in settings.batches:
        _ratios([r for r in rows if r["batch"] == batch])


def _rates(row: dict[str, Any], new_tokens: int, flops: float, peak_gflops: float) -> None:
    median = row["median_s"]
    if not median:
        row.update(tokens_per_s=None, ms_per_step=None, gflops=None, fraction_of_peak=None)
        return
    batch = row["batch"]
    gflops = batch * flops / median / 1e9
    row["tokens_per_s"] = round(batch * new_tokens / median, 2)
    row["ms_per_step"] = round(median / new_tokens * 1000, 4)
    row["gflops"] = round(gflops, 2)
    row["fraction_of_peak"] = round(gflops / peak_gflops, 4) if peak_gflops else None


def _ratios(same_batch: list[dict[str, Any]]) -> None:
    """Ratios to the best CTranslate2 split of the row's precision (else fp32) and to HF
    ``generate`` with KV cache (fp16 rows: the half-precision model's, when it ran)."""
    measured = [r for r in same_batch if r["tokens_per_s"]]
    by_engine = {r["engine"]: r for r in measured}
    hf = by_engine.get(HF_REFERENCE)
    best_ct2 = {
        precision: max(
            (r for r in measured if r["family"] == "ctranslate2" and r["precision"] == precision),
            key=lambda r: r["tokens_per_s"],
            default=None,
        )
        for precision in PRECISIONS
    }
    for row in same_batch:
        ct2 = best_ct2.get(row["precision"]) or best_ct2.get("fp32")
        _ratio(row, ct2, "ratio_to_ctranslate2")
        fp16_hf = by_engine.get(HF_FP16_REFERENCE) if row["precision"] == "fp16" else None
        _ratio(row, fp16_hf or hf, "ratio_to_hf")


def _ratio(row: dict[str, Any], peer: dict[str, Any] | None, key: str) -> None:
    """``row[key]``: its rate over ``peer``'s; ``key_rounds`` and ``key_range``: per round."""
    rate = row["tokens_per_s"]
    row[key] = round(rate / peer["tokens_per_s"], 3) if rate and peer else None
    rounds = round_ratios(row.get("runs_s"), None if peer is None else peer.get("runs_s"))
    row[f"{key}_rounds"] = rounds
    row[f"{key}_range"] = [min(rounds), max(rounds)] if rounds else None


def round_ratios(ours: list[float] | None, peer: list[float] | None) -> list[float] | None:
    """Per interleaved round, the peer's time over ours (the same work: a rate ratio); None
    unless both ran every round."""
    if not ours or not peer or len(ours) != len(peer):
        return None
    return [round(theirs / mine, 3) for mine, theirs in zip(ours, peer, strict=True)]


ATTNSERVE_VARIANTS = ("", "-kv8", "-cudagraph")  # summarised beside the peers, per precision


def summary(rows: list[dict[str, Any]], settings: EngineSettings) -> dict[str, Any]:
    """Per batch: tokens/s per engine; best CTranslate2 split per precision; ours vs peers."""
    by_batch: dict[str, Any] = {}
    for batch in settings.batches:
        same = [r for r in rows if r["batch"] == batch and r["tokens_per_s"]]
        entry: dict[str, Any] = {"tokens_per_s": {r["engine"]: r["tokens_per_s"] for r in same}}
        for precision in PRECISIONS:
            ct2 = [r for r in same if r["family"] == "ctranslate2" and r["precision"] == precision]
            if ct2:
                best = max(ct2, key=lambda r: r["tokens_per_s"])
                entry[f"best_ctranslate2_{precision}"] = {
                    "engine": best["engine"],
                    "tokens_per_s": best["tokens_per_s"],
                }
            for engine in (f"attnserve-{precision}{variant}" for variant in ATTNSERVE_VARIANTS):
                ours = next((r for r in same if r["engine"] == engine), None)
                if ours is not None:
                    entry[engine.replace("-", "_")] = {
                        "tokens_per_s": ours["tokens_per_s"],
                        "ratio_to_ctranslate2": ours.get("ratio_to_ctranslate2"),
                        "ratio_to_hf": ours.get("ratio_to_hf"),
                        "fraction_of_peak": ours.get("fraction_of_peak"),
                    }
        by_batch[str(batch)] = entry
    return {"by_batch": by_batch}
