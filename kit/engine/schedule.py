"""Which batches one run is made of, all derived from the case in its config: an eager run is a
sequence on one backend instance ending with the case, a graph run the replay schedule (SPEC
"Graph mode"), each as the case's mode's rules say (ModeRules.eager_sequence, .replay_schedule)."""
from __future__ import annotations

from typing import List

from kit.engine.case import Case
from kit.engine.modes import rules_for
from kit.engine.profile import EngineProfile
from kit.modes import Exec


def batches(case: Case, exec_: Exec, profile: EngineProfile) -> List[Case]:
    rules = rules_for(case.mode)
    return rules.eager_sequence(case) if exec_ is Exec.EAGER else rules.replay_schedule(case, profile)
