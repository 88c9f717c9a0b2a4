"""Client-side rate limits for judge calls: requests/minute, tokens/minute, concurrency, slow-down.

Token bucket rule (the same for requests and tokens). With limit L per window W (60 s; tests
may shrink W to scale time) and burst B:
    refill rate = (L - B) / W, capacity = B, the bucket starts full.
In any window of length T the bucket grants at most B + (L - B) * T / W, so at most L in any
window of W seconds (never more than rpm per minute), and over a 5 s window at most
B + (L - B) / 12. The default burst is B = max(1, L // 480), 2.5 % of a 5 s window's share, so
the limiter grants at most about L / 12 * 1.025 in any 5 s window (rpm 600 -> B = 1, at most 50.9).
The other half of the 5 % allowance is headroom for what happens between the grant and the
server: a request granted early but delayed on the way (event loop, connection set-up, network)
can land in the same server-side window as later ones.

Tokens: a request's cost is estimated before it is sent (`estimate_tokens`):
    ceil(total characters of the message contents / 4) + (max_tokens or 256).
A request costing more than the whole bucket is let through when the bucket is full and drives
the level negative (a debt paid back by the refill), so large prompts are slowed, never stuck.
When the response's usage arrives, the difference (actual - estimate) is charged or refunded
(`correct_tokens`); a refund never fills the bucket above its capacity.

Slow-down (`pause`, `observe_headers`): the limiter is paused (nothing is granted) until a time:
- on a 429 that is a rate limit: for Retry-After when the server sent one, else the backoff delay;
- when `x-ratelimit-remaining-requests` (or `-tokens`) is low, i.e. <= max(1, 5 % of the
  matching `x-ratelimit-limit-*`) (<= 1 when the limit header is absent): for the matching
  `x-ratelimit-reset-*` duration ("12ms", "1s", "6m0s"), one request interval W / rpm when
  absent, capped at W.
  Negative values (Azure sends -1) and unparsable values are ignored.
Pauses only extend (a shorter pause never shortens a longer one).

Concurrency is a separate asyncio.Semaphore held by the client for each attempt.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import typing

DEFAULT_COMPLETION_TOKENS = 256
CHARS_PER_TOKEN = 4
LOW_REMAINING_FRACTION = 0.05


def default_burst(limit: int) -> int:
    return max(1, int(limit) // 480)


def estimate_tokens(messages: typing.Iterable[tuple[str, str]], max_tokens: int | None) -> int:
    """ceil(chars / 4) of the message contents + (max_tokens or 256): deliberately simple."""
    chars = sum(len(content) for _, content in messages)
    completion = max_tokens if max_tokens is not None else DEFAULT_COMPLETION_TOKENS
    return math.ceil(chars / CHARS_PER_TOKEN) + completion


class TokenBucket:
    """Limit L per window W with burst B (see the module docstring). Not thread-safe: one loop."""

    def __init__(self, limit: float, window_s: float = 60.0, burst: float | None = None,
                 clock: typing.Callable[[], float] = time.monotonic):
        if limit <= 0:
            raise ValueError("limit must be positive")
        self.limit = float(limit)
        self.window_s = float(window_s)
        self.burst = float(default_burst(int(limit)) if burst is None else burst)
        if not 0 < self.burst <= self.limit:
            raise ValueError("burst must be in (0, limit]")
        # (L - B) / W; when B == L (a limit of 1) there is no refill beyond the burst, so use L / W
        self.rate = max(self.limit - self.burst, 0.0) / self.window_s or self.limit / self.window_s
        self.clock = clock
        self.level = self.burst
        self.updated = clock()

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_time(self, cost: float, now: float | None = None) -> float:
        """Seconds until `cost` can be taken (0 if now). Oversize costs wait for a full bucket."""
        now = self.clock() if now is None else now
        self._refill(now)
        need = min(cost, self.burst)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, cost: float) -> None:
        self.level -= cost  # may go negative: a debt (oversize request or an under-estimate)

    def adjust(self, delta: float) -> None:
        """Charge (delta > 0) or refund (delta < 0) tokens after the fact; refunds stop at capacity."""
        self._refill(self.clock())
        self.level = min(self.burst, self.level - delta)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_reset_duration(text: typing.Any) -> float | None:
    """'12ms' -> 0.012, '1s' -> 1, '6m0s' -> 360, '1h2m' -> 3720, '2.5' -> 2.5; None if unparsable."""
    if text is None:
        return None
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text):
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(value) * scale[unit] for value, unit in parts)


class RateLimiter:
    """Requests-per-window and tokens-per-window buckets plus a pause, granted in FIFO order."""

    def __init__(self, rpm: int, tpm: int, window_s: float = 60.0,
                 rpm_burst: int | None = None, tpm_burst: int | None = None,
                 clock: typing.Callable[[], float] = time.monotonic, record_grants: bool = False):
        self.window_s = float(window_s)
        self.clock = clock
        self.requests = TokenBucket(rpm, window_s, rpm_burst, clock)
        self.tokens = TokenBucket(tpm, window_s, tpm_burst, clock)
        self.paused_until = 0.0
        self.grants: list[float] | None = [] if record_grants else None
        self._lock: asyncio.Lock | None = None

    async def acquire(self, tokens: int) -> None:
        """Wait until one request and `tokens` tokens may be sent, and take them."""
        if self._lock is None:  # created lazily: inside the running loop
            self._lock = asyncio.Lock()
        async with self._lock:  # FIFO: a large request is not starved by small ones
            while True:
                now = self.clock()
                if now < self.paused_until:
                    await asyncio.sleep(self.paused_until - now)
                    continue
                wait = max(self.requests.wait_time(1, now), self.tokens.wait_time(tokens, now))
                if wait <= 0:
                    self.requests.take(1)
                    self.tokens.take(tokens)
                    if self.grants is not None:
                        self.grants.append(now)
                    return
                # re-check after sleeping: a pause may have been set meanwhile
                await asyncio.sleep(wait)

    def correct_tokens(self, estimate: int, actual: int) -> None:
        """Charge the difference between the usage the server reported and the estimate."""
        if actual > 0:
            self.tokens.adjust(actual - estimate)

    def pause(self, seconds: float) -> None:
        if seconds and seconds > 0:
            self.paused_until = max(self.paused_until, self.clock() + min(seconds, self.window_s))

    def observe_headers(self, headers: typing.Mapping[str, str]) -> float:
        """Apply the low-remaining rule to x-ratelimit-* headers; returns the pause set (0 if none)."""
        paused = 0.0
        for kind in ("requests", "tokens"):
            remaining = _number(headers.get(f"x-ratelimit-remaining-{kind}"))
            if remaining is None or remaining < 0:
                continue
            limit = _number(headers.get(f"x-ratelimit-limit-{kind}"))
            low = max(1.0, LOW_REMAINING_FRACTION * limit) if limit is not None and limit > 0 else 1.0
            if remaining <= low:
                reset = parse_reset_duration(headers.get(f"x-ratelimit-reset-{kind}"))
                # No reset hint: wait one request interval of our own limit (W / rpm). A fixed
                # second here cost 5% of the rate against a server that is kept exactly at its
                # limit (its remaining count then touches 0-1 regularly).
                interval = self.window_s / self.requests.limit
                seconds = min(interval if reset is None or reset < 0 else reset, self.window_s)
                self.pause(seconds)
                paused = max(paused, seconds)
        return paused


def _number(value: typing.Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
