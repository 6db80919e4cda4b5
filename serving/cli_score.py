"""`attnserve score`: how likely a running server's translator or captioner finds given outputs.

    attnserve score --to de "ninety" "neunzig" "ninety" "neunzehn"
    attnserve score --image scene.png "a red circle" "two blue squares"

Prints one line per target: its score (the sum of its tokens' log-probabilities and EOS's), its
mean per token, and the target; ``--log-probs`` adds a tab-separated line of each token's
log-probability, EOS's last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_score_arguments(command: argparse.ArgumentParser) -> None:
    """The arguments of `attnserve score` after the client's common ones."""
    command.add_argument(
        "pairs",
        nargs="+",
        metavar="TEXT",
        help="with --to: SOURCE TARGET pairs (source, then its target, repeated); with --image: "
        "the captions to score for that image",
    )
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--to", help="a translator's target language: de, fr or es")
    source.add_argument("--image", type=Path, help="a PNG or JPEG file: score its captions")
    command.add_argument(
        "--log-probs",
        action="store_true",
        help="also print each target token's log-probability, EOS's last",
    )


def run_score(
    client: Any, args: argparse.Namespace, routing: dict[str, Any], image: bytes | None
) -> int:
    """Score the pairs (or the captions of ``image``, the bytes of ``--image``) and print them;
    2 for an odd pair list."""
    if image is not None:
        targets = list(args.pairs)
        scores = client.score_captions([image] * len(targets), targets, **routing)
    else:
        if len(args.pairs) % 2:
            print(
                "attnserve score: --to takes SOURCE TARGET pairs; "
                f"{len(args.pairs)} texts leave one without its target",
                file=sys.stderr,
            )
            return 2
        sources, targets = list(args.pairs[::2]), list(args.pairs[1::2])
        scores = client.score(sources, targets, args.to, **routing)
    for target, scored in zip(targets, scores, strict=True):
        mean = scored.score / (len(scored.token_ids) + 1)
        print(f"{scored.score:.4f}\t{mean:.4f}\t{target}")
        if args.log_probs:
            values = [*scored.token_log_probs, scored.eos_log_prob]
            print("\t".join(f"{p:.4f}" for p in values))
    return 0
