"""What a million output tokens cost, in dollars and in joules: the price per accelerator-hour of each
card (an assumption, with its source beside it), the card a run ran on, and the two sums.

- ``$/M output tokens = price per accelerator-hour x accelerators / (output tok/s x 3600) x 1e6``
- ``J/M output tokens = joules_per_output_token x 1e6``, only where the run measured its energy.

The prices are the one place a cost figure's assumption lives (:data:`DEFAULT_PRICES`). They are
rental prices, not what a card costs its owner; override them with ``MOEBENCH_ACCELERATOR_PRICES``
(``h100=2.5,h200=3.2``, :class:`engines.settings.Settings`) or on the Sweep page. A run whose card has
no price (an unnamed CUDA device, an unknown part) gets no dollar figure, never a guessed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engines.errors import ConfigError

PRICES_ENV = "MOEBENCH_ACCELERATOR_PRICES"


@dataclass(frozen=True)
class Price:
    """A price per accelerator-hour (US dollars) of one card, and where it comes from."""

    card: str  # this table's key: h100, h200, ascend-910b, mlu590, cpu
    name: str  # what a legend shows: "H100"
    usd_per_hour: float
    source: str  # the document it comes from, or why it is an assumption
    assumption: bool = True  # a figure chosen here, not a list price of this exact card

    @property
    def text(self) -> str:
        """``$2.00 per H100-hour (assumption: ...)``: the price with its basis, for captions and hovers."""
        kind = "assumption" if self.assumption else "list price"
        return f"${self.usd_per_hour:.2f} per {self.name}-hour ({kind}: {self.source})"


_DEEPSEEK = (
    "DeepSeek's own cost sums assume $2 per H800 GPU-hour (DeepSeek-V3 Technical Report, arXiv:2412.19437, "
    "section 1; 'DeepSeek-V3/R1 Inference System Overview', 2025-03-01)"
)

# Rental prices per accelerator-hour. Every one is an assumption: cloud prices for the same card spread
# over more than 2x between providers and move month to month (on-demand H100 SXM5 quotes of
# $1.99-5.00 per GPU-hour in May 2026, https://www.mercatus-ai.com/blog/cloud-gpu-pricing).
DEFAULT_PRICES: dict[str, Price] = {
    p.card: p
    for p in (
        Price("h100", "H100", 2.00, f"{_DEEPSEEK}, taken for the H100 (the same Hopper die)"),
        Price(
            "h200",
            "H200",
            2.50,
            "low end of on-demand H200 SXM5 quotes, $2.50-7.00 per GPU-hour in May 2026 "
            "(https://www.mercatus-ai.com/blog/cloud-gpu-pricing)",
        ),
        Price(
            "ascend-910b",
            "Ascend 910B",
            2.00,
            f"no public per-card rental list price found; the H800 figure of {_DEEPSEEK}",
        ),
        Price(
            "mlu590",
            "MLU590",
            2.00,
            f"no public per-card rental list price found; the H800 figure of {_DEEPSEEK}",
        ),
        Price(
            "cpu",
            "CPU host",
            1.428,
            "a 32-vCPU cloud host: AWS EC2 c7i.8xlarge on demand, us-east-1 (16 x the c7i.large's $0.08925/h, "
            "https://aws.amazon.com/ec2/pricing/on-demand/); a CPU run counts the host as its one accelerator",
        ),
    )
}

# A device name's part -> card (lower case, spaces removed); the first match wins.
_CARD_NEEDLES: tuple[tuple[str, str], ...] = (
    ("h100", "h100"),
    ("h800", "h100"),
    ("h200", "h200"),
    ("910b", "ascend-910b"),
    ("mlu590", "mlu590"),
)


def card_of(accelerator: str | None, engine_info: Mapping[str, Any] | None) -> str:
    """The card a run ran on, as a key of the price table: named from the device the run recorded
    (``NVIDIA H100 80GB HBM3`` -> ``h100``), ``cpu`` for a CPU run, else the accelerator kind itself
    (``cuda``, ``npu``, ``mlu``: a device that was not named, which has no default price)."""
    info = engine_info or {}
    device = str(info.get("device") or "").lower().replace(" ", "")
    for needle, card in _CARD_NEEDLES:
        if needle in device:
            return card
    kind = str(accelerator or info.get("accelerator") or "").lower()
    return kind or "unknown"


def parse_prices(text: str) -> dict[str, float]:
    """``h100=2.5,h200=3.2`` -> {"h100": 2.5, "h200": 3.2}; ConfigError (one line) on anything else."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in str(text or "").split(",")):
        if not part:
            continue
        card, sep, value = part.partition("=")
        try:
            price = float(value) if sep else float("nan")
        except ValueError:
            price = float("nan")
        if not card.strip() or not (price >= 0 and price < 1e6):
            raise ConfigError(f"{PRICES_ENV}: give CARD=DOLLARS_PER_HOUR pairs like h100=2.5,h200=3.2, got '{part}'")
        out[card.strip().lower()] = price
    return out


def price_table(overrides: Mapping[str, float] | None = None, settings_text: str | None = None) -> dict[str, Price]:
    """The prices in force: :data:`DEFAULT_PRICES`, then ``MOEBENCH_ACCELERATOR_PRICES`` (``settings_text``;
    read from the settings when None), then ``overrides`` (the page's inputs). A price set by the user says
    so in its source; a card the defaults lack (``cuda``) gets a price only this way."""
    if settings_text is None:
        from engines.settings import get_settings

        settings_text = get_settings().accelerator_prices
    table = dict(DEFAULT_PRICES)
    for origin, given in ((PRICES_ENV, parse_prices(settings_text)), ("set by the user", dict(overrides or {}))):
        for card, usd in given.items():
            base = table.get(card)
            if base is not None and base.usd_per_hour == usd:
                continue
            source = f"{origin}" + (f"; default ${base.usd_per_hour:.2f}" if base else "")
            table[card] = (
                replace(base, usd_per_hour=float(usd), source=source)
                if base
                else Price(card, card.upper(), float(usd), source)
            )
    return table


def usd_per_million_output_tokens(
    usd_per_accelerator_hour: float | None, accelerators: int | None, output_tok_s: float | None
) -> float | None:
    """price x accelerators / (output tok/s x 3600) x 1e6; None when any is unknown or no token came out."""
    if usd_per_accelerator_hour is None or not accelerators or not output_tok_s or output_tok_s <= 0:
        return None
    return usd_per_accelerator_hour * accelerators / (output_tok_s * 3600.0) * 1e6


def joules_per_million_output_tokens(joules_per_output_token: float | None) -> float | None:
    """joules_per_output_token x 1e6; None where the run measured no energy."""
    return None if joules_per_output_token is None else joules_per_output_token * 1e6
