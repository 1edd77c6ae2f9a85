"""The service check: a Blazar unit installed for this user or the system (or a launchd agent) that runs another
install or serves another home is a warning naming both and the fix; none installed is fine."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping

from blazar.errors import ServiceError
from blazar.operations.doctor.report import Check, ok
from blazar.operations.service.manage import Found, look, place
from blazar.operations.service.target import Scope, target
from blazar.paths import Paths


def service(paths: Paths, env: Mapping[str, str], *, executable: str = sys.executable,
            platform: str = sys.platform) -> Check:
    user_home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    this = target(paths, env, executable=executable, archive=paths.archive)
    found: list[Found] = []
    for scope in ("user", "system"):
        try:
            where = place(scope, platform=platform, config_home=env.get("XDG_CONFIG_HOME"), user_home=user_home)
        except ServiceError:
            continue  # no such scope here (macOS has no system unit of ours; another platform none at all)
        seen = look(where, this, paths, None, user_home=user_home)
        if seen is not None:
            found.append(seen)
    if not found:
        return ok("machine", "service", "no Blazar service is installed (neither a user nor a system unit)")
    wrong = [f for f in found if not f.points_here]
    if not wrong:
        return ok("machine", "service", "; ".join(f"the {f.place.scope} service {f.place.path} runs this install "
                                                   f"for this home" for f in found))
    return Check("machine", "service", "warn", "; ".join(_why(f, this.argv, paths) for f in wrong),
                 fix=" or ".join(_fix(f.place.scope) for f in wrong) + " (writes it again for this install and "
                 "home), or `blazar service uninstall` to remove it")


def _why(f: Found, ours: tuple[str, ...], paths: Paths) -> str:
    theirs = " ".join(f.argv) or "nothing"
    parts = []
    if not f.same_install:
        parts.append(f"runs {theirs}, not this install ({' '.join(ours)})")
    if not f.same_home:
        parts.append(f"serves the home {f.home}, not this one ({paths.data_dir})")
    return f"the {f.place.scope} service {f.place.path} " + " and ".join(parts)


def _fix(scope: Scope) -> str:
    return "`blazar service install`" if scope == "user" else "`sudo blazar service install --system`"
