"""Plain records between the monitor's stages: hooks -> StepStats -> detector -> Alerts -> outputs."""
from dataclasses import dataclass, field


@dataclass
class StepStats:
    """Every statistic of one logged step on one rank, host numbers.

    ``keys[i]`` is ``(name, metric)`` with value ``values[i]``; ``order[i]`` is where the
    value arose in the step (phase: 0 forward, 1 backward, 2 optimizer; then the position
    in that phase's call order), so the earliest anomaly of a step can be named.
    ``owners`` maps a parameter name to its module's name.
    """
    step: int
    rank: int
    keys: list
    values: list
    order: list
    owners: dict = field(default_factory=dict)


@dataclass
class Alert:
    step: int
    rank: int
    name: str
    metric: str
    value: float
    expected: object        # [low, high] for a spike, "finite" / 0 for NaN/Inf
    kind: str               # "nonfinite" or "spike"
    module: str             # the module the name belongs to (a parameter's owner)
    first: bool = False     # the step's earliest alert in call order

    def as_json(self):
        return {"step": self.step, "rank": self.rank, "name": self.name, "metric": self.metric,
                "value": self.value, "expected": self.expected, "kind": self.kind, "module": self.module,
                "first": self.first}
