"""The engine goals of `attnserve bench engine`, judged from one run's rows (pure arithmetic, so
`bench report` judges older results alike).

Each goal takes attnserve's best configuration of a precision at that batch (one engine of all
the threads, engine instances, the int8 KV cache, the growing cache: what a user can deploy) and
names it in ``engine``. Ratios are the same run's medians (``engine_figures``); the per-round
range goes along.

On the CPU:

- ``fp32_vs_ctranslate2_b16``: fp32 >= 1.3x the best CTranslate2 fp32 thread split at batch 16;
- ``int8_vs_ctranslate2_b{N}`` (N = 1, 8, 16, 32 as measured): int8 >= 1.1x CTranslate2 int8 on
  a CPU with AVX-512 VNNI, >= 1.0x on others.

On CUDA:

- ``vs_hf_b{64,256}[fp32|fp16]``: >= 3x Hugging Face ``generate`` of the same precision on the
  same GPU;
- ``tokens_per_s_b256``: >= 60,000 new tokens/s at batch 256 (any precision);
- ``step_ms_b1``: a batch-1 decode step <= 0.5 ms (any precision);
- ``fp16_vs_fp32_b{N}``: fp16 faster than fp32 at every measured batch.
"""

from __future__ import annotations

from typing import Any

from benchmarks.serve_goals import goal_record

FP32_VS_CT2 = 1.3
FP32_VS_CT2_BATCH = 16
INT8_VS_CT2_VNNI = 1.1
INT8_VS_CT2 = 1.0
INT8_BATCHES = (1, 8, 16, 32)
GPU_VS_HF = 3.0
GPU_VS_HF_BATCHES = (64, 256)
GPU_TOKENS_PER_S_B256 = 60_000.0
GPU_STEP_MS_B1 = 0.5
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")


def engine_goals(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of an engine result document (its ``results``, ``settings`` and ``machine``)."""
    rows = [r for r in document["results"] if r["family"] == "attnserve"]
    batches = list(document["settings"]["batches"])
    if document["settings"].get("device", "cpu") == "cuda":
        return _gpu_goals(rows, batches)
    flags = document["machine"].get("cpu_flags", [])
    return _cpu_goals(rows, batches, any(f in flags for f in VNNI_FLAGS))


def _best(rows: list[dict[str, Any]], batch: int, precision: str | None, key: str) -> Any:
    """attnserve's row with the highest ``key`` at ``batch`` (of ``precision`` unless None)."""
    measured = [
        r
        for r in rows
        if r["batch"] == batch
        and (precision is None or r["precision"] == precision)
        and r.get(key) is not None
    ]
    return max(measured, key=lambda r: r[key]) if measured else None


def _row_goal(
    name: str,
    goal: str,
    row: dict[str, Any] | None,
    key: str,
    target: float,
    unit: str = "x",
    at_least: bool = True,
) -> dict[str, Any]:
    """The goal on ``row[key]`` (None: not measured), naming the row's engine."""
    return goal_record(
        name,
        goal,
        row[key] if row else None,
        target,
        at_least,
        unit,
        engine=row["engine"] if row else None,
        rounds_range=row.get(f"{key}_range") if row else None,
    )


def _cpu_goals(rows: list[dict[str, Any]], batches: list[int], vnni: bool) -> list[dict]:
    goals = []
    if FP32_VS_CT2_BATCH in batches and any(r["precision"] == "fp32" for r in rows):
        b = FP32_VS_CT2_BATCH
        goals.append(
            _row_goal(
                f"fp32_vs_ctranslate2_b{b}",
                f"fp32 at batch {b}: new tokens/s >= {FP32_VS_CT2}x the best CTranslate2 fp32 "
                "thread split's (same run)",
                _best(rows, b, "fp32", "ratio_to_ctranslate2"),
                "ratio_to_ctranslate2",
                FP32_VS_CT2,
            )
        )
    if any(r["precision"] == "int8" for r in rows):
        target = INT8_VS_CT2_VNNI if vnni else INT8_VS_CT2
        where = "a CPU with AVX-512 VNNI" if vnni else "a CPU without VNNI"
        for b in (b for b in INT8_BATCHES if b in batches):
            goals.append(
                _row_goal(
                    f"int8_vs_ctranslate2_b{b}",
                    f"int8 at batch {b} on {where}: new tokens/s >= {target}x the best "
                    "CTranslate2 int8 thread split's (same run)",
                    _best(rows, b, "int8", "ratio_to_ctranslate2"),
                    "ratio_to_ctranslate2",
                    target,
                )
            )
    return goals


def _gpu_goals(rows: list[dict[str, Any]], batches: list[int]) -> list[dict[str, Any]]:
    goals = []
    precisions = sorted({r["precision"] for r in rows})
    for precision in precisions:
        for b in (b for b in GPU_VS_HF_BATCHES if b in batches):
            goals.append(
                _row_goal(
                    f"vs_hf_b{b}[{precision}]",
                    f"{precision} at batch {b} on the GPU: new tokens/s >= {GPU_VS_HF}x Hugging "
                    f"Face generate's ({precision}, KV cache, same GPU, same run)",
                    _best(rows, b, precision, "ratio_to_hf"),
                    "ratio_to_hf",
                    GPU_VS_HF,
                )
            )
    if 256 in batches:
        goals.append(
            _row_goal(
                "tokens_per_s_b256",
                f"batch 256 on the GPU: >= {GPU_TOKENS_PER_S_B256:,.0f} new tokens/s",
                _best(rows, 256, None, "tokens_per_s"),
                "tokens_per_s",
                GPU_TOKENS_PER_S_B256,
                "tok/s",
            )
        )
    if 1 in batches:
        step = [r for r in rows if r["batch"] == 1 and r.get("ms_per_step") is not None]
        goals.append(
            _row_goal(
                "step_ms_b1",
                f"batch 1 on the GPU: a decode step <= {GPU_STEP_MS_B1} ms (encoder amortised)",
                min(step, key=lambda r: r["ms_per_step"]) if step else None,
                "ms_per_step",
                GPU_STEP_MS_B1,
                "ms",
                at_least=False,
            )
        )
    if {"fp16", "fp32"} <= set(precisions):
        for b in batches:
            fp16 = _best(rows, b, "fp16", "tokens_per_s")
            fp32 = _best(rows, b, "fp32", "tokens_per_s")
            goals.append(
                goal_record(
                    f"fp16_vs_fp32_b{b}",
                    f"batch {b} on the GPU: attnserve fp16 at least as fast as fp32 (best "
                    "configuration of each, same run)",
                    fp16["tokens_per_s"] / fp32["tokens_per_s"] if fp16 and fp32 else None,
                    1.0,
                    True,
                    "x",
                    engine=fp16["engine"] if fp16 else None,
                    fp32_engine=fp32["engine"] if fp32 else None,
                )
            )
    return goals
