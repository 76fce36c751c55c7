"""The user's state folder: named by GATEKEEPER_HOME or the platform's convention; an unwritable one is one line."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from gatekeeper._errors import UsageError
from gatekeeper.state._home import check_home, ensure_home, state_home


@pytest.mark.parametrize(("environ", "platform", "expected"), [
    ({"GATEKEEPER_HOME": "/srv/gk", "HOME": "/h"}, "linux", "/srv/gk"),
    ({"HOME": "/h"}, "linux", "/h/.local/state/gatekeeper"),
    ({"HOME": "/h", "XDG_STATE_HOME": "/x"}, "linux", "/x/gatekeeper"),
    ({"HOME": "/h", "XDG_STATE_HOME": "relative"}, "linux", "/h/.local/state/gatekeeper"),  # (XDG: relative is ignored)
    ({"HOME": "/h"}, "darwin", "/h/Library/Application Support/gatekeeper"),
    ({"HOME": "/h", "LOCALAPPDATA": "C:/Users/u/AppData/Local"}, "win32", "C:/Users/u/AppData/Local/gatekeeper"),
])
def test_the_state_folder_follows_the_setting_then_the_platform(environ: dict[str, str], platform: str, expected: str) -> None:
    """GATEKEEPER_HOME wins; otherwise each platform's per-user state folder."""
    assert state_home(environ, platform=platform) == Path(expected)


def test_the_state_folder_is_made_for_this_user_only(tmp_path: Path) -> None:
    """The folder (and one under it) is created, mode 0700."""
    folder = ensure_home({"GATEKEEPER_HOME": str(tmp_path / "gk")}, "ledger")
    assert folder == tmp_path / "gk" / "ledger" and folder.is_dir()
    assert (folder.stat().st_mode & 0o777) == 0o700


def _ensure_many(home: str) -> int:
    for _ in range(300):
        ensure_home({"GATEKEEPER_HOME": home}, "ledger")
    return os.getpid()


def test_jobs_starting_at_once_on_one_host_never_refuse_each_other_the_folder(tmp_path: Path) -> None:
    """Several processes checking the same folder at once (two submits started together; a CI run found one refused,
    exit 2, its probe file removed by the other): each checks with a probe of its own, so none is refused."""
    home = str(tmp_path / "gk")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pids = pool.map(_ensure_many, [home] * 4)
    assert len(set(pids)) >= 2 and not list((tmp_path / "gk" / "ledger").iterdir())


def test_a_file_where_the_folder_should_be_is_one_line(tmp_path: Path) -> None:
    """A file in the way (any user, root included) is a UsageError naming the folder."""
    (tmp_path / "gk").write_text("not a folder")
    with pytest.raises(UsageError) as e:
        ensure_home({"GATEKEEPER_HOME": str(tmp_path / "gk")}, "ledger")
    assert str(tmp_path / "gk" / "ledger") in str(e.value)


def test_a_reading_names_why_the_folder_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` (which never creates the folder) says why, as `submit`'s line does: a file in the way, a read-only
    file system (a cold tester's mount), or no permission."""
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UsageError, match="is not a folder"):
        check_home({"GATEKEEPER_HOME": str(tmp_path / "file" / "gk")})
    monkeypatch.setattr("os.access", lambda *a, **k: False)  # (root may write anywhere: the reading is what is tested)
    with pytest.raises(UsageError, match="Permission denied") as e:
        check_home({"GATEKEEPER_HOME": str(tmp_path / "gk")})
    assert str(tmp_path / "gk") in str(e.value) and "GATEKEEPER_HOME" in str(e.value)
    read_only = type("F", (), {"f_flag": os.ST_RDONLY})()
    monkeypatch.setattr("os.statvfs", lambda p: read_only)
    with pytest.raises(UsageError, match="Read-only file system"):
        check_home({"GATEKEEPER_HOME": str(tmp_path / "gk")})
