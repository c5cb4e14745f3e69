"""What a node's exit status means. The node exits with one of these; ECS keeps it as the stopped
container's exitCode, and `flotilla status` names it beside the task. Declared once, for both.

A node that can never serve (the unit's layout cannot run the model, the model is not published as
its manifest says, the model cannot be read) exits at once with its own status instead of spending
its restart budget: the same settings and model would fail the same way every time.

That exit is what stops a rollout of such a node within minutes. ECS's deployment circuit breaker
counts a task as failed "if the service scheduler can't launch the task, the task doesn't transition
to a RUNNING state, or if it fails any of its defined health checks and is stopped" (ECS API
reference, API_Deployment.html, failedTasks); "if a Task fails before reporting a health check, the
failedTask count is not reset" (the ECS team in aws/containers-roadmap#1206, 2021-12-16), and a node
never passes its container health check before its unit has served. The deployment fails at
0.5 x the desired task count failed, at least 3 (API_ServiceDeploymentCircuitBreaker.html,
threshold), and rolls back (stacks/unit.py). docs/node.md, "Exit status", has the arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DRAINED = 0  # told to stop (SIGTERM) and drained
RESTART_BUDGET_EXHAUSTED = 1  # re-formed more than max_restarts times within the restart window
BAD_SETTINGS = 2  # a flag or environment variable the node refused at start
LAYOUT_REFUSED = 3  # the unit's layout cannot serve the model (contract/layout.py)
MODEL_NOT_PUBLISHED = 4  # no flotilla-manifest.json at the model URI, or the files differ from it
MODEL_UNREADABLE = 5  # the model's config.json, weights or tokenizer cannot be read

CANNOT_SERVE = frozenset({LAYOUT_REFUSED, MODEL_NOT_PUBLISHED, MODEL_UNREADABLE})

MEANINGS: Mapping[int, str] = MappingProxyType(
    {
        DRAINED: "drained and stopped",
        RESTART_BUDGET_EXHAUSTED: "the unit re-formed more often than its restart budget allows",
        BAD_SETTINGS: "the node refused a setting at start",
        LAYOUT_REFUSED: "the unit's layout cannot serve the model (nodes per unit, instance type, memory)",
        MODEL_NOT_PUBLISHED: "the model is not published as its flotilla-manifest.json says (or has none)",
        MODEL_UNREADABLE: "the model's config.json, weights or tokenizer cannot be read",
    }
)
# The node's log event that carries the one-line reason of a CANNOT_SERVE exit.
CANNOT_SERVE_EVENT = "node_cannot_serve"


def meaning(code: int) -> str | None:
    """What the exit status says, or None for one the node does not use (a signal, a crash)."""
    return MEANINGS.get(code)
