"""What every benchmark shares: the machine's load recorded beside its numbers (a ratio taken on
a busy machine says so), and one JSON file per benchmark under bench/results/ (not committed)."""
import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def load() -> str:
    """The 1, 5 and 15 minute load averages, e.g. "2.93 2.65 3.82" ("unknown" where there are none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def write(name: str, data: dict, **dump) -> str:
    """Write `data` to bench/results/<name>.json; return the path."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1, **dump)
    return path
