"""The operator's own metrics: admissions by result and reason, handler errors.

Separate from the runtime's (``flashrt.runtime.metrics``): the operator image has no torch.
"""

from __future__ import annotations

from prometheus_client import Counter

ADMISSIONS = Counter(
    "flashrt_operator_admissions", "Pod admissions by result (injected, skipped, unchanged, error) and reason code.",
    ("result", "reason"),
)  # fmt: skip
HANDLER_ERRORS = Counter("flashrt_operator_handler_errors", "Operator handler failures by handler.", ("handler",))
