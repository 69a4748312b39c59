"""Halide's own source (https://github.com/halide/Halide), where the benchmarks and the Halide 22
kit take Halide's generators, apps and tests from: a git repository (a checkout, or a bare
mirror with no work tree) read at a ref, or any other folder read as it is.

Files are read from git's objects (git show, git cat-file), never by checking anything out: a
mirror may lack its largest files (images), which ``git archive`` would fail on whole.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class HalideSource:
    """A Halide source tree: ``path`` read at ``ref`` where it is a git repository."""

    def __init__(self, path, ref: str):
        self.path = Path(path)
        self.is_git = (self.path / ".git").exists() or (self.path / "HEAD").is_file()
        self.ref = ref if self.is_git else None
        if self.is_git:
            self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
                      error=f"{self.path} has no {ref} (--ref names a tag, branch or commit)")

    def __str__(self) -> str:
        return f"{self.path} at {self.ref}" if self.is_git else str(self.path)

    def _git(self, *args, error: str = "", stdin: bytes | None = None) -> bytes:
        done = subprocess.run(["git", "-C", str(self.path), *args], input=stdin,
                              capture_output=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(error or f"git {' '.join(args)} in {self.path} failed: "
                               f"{done.stderr.decode(errors='replace')}")
        return done.stdout

    def read(self, relative: str) -> bytes:
        if self.is_git:
            return self._git("show", f"{self.ref}:{relative}")
        return (self.path / relative).read_bytes()

    def files(self, folder: str) -> list[str]:
        """The files under ``folder`` (relative paths, sorted)."""
        if self.is_git:
            listing = self._git("ls-tree", "-r", "-z", "--name-only", self.ref, "--", folder)
            return sorted(name.decode() for name in listing.split(b"\0") if name)
        base = self.path / folder
        return sorted(p.relative_to(self.path).as_posix() for p in base.rglob("*") if p.is_file())

    def extract(self, folders, dest: Path) -> list[str]:
        """Copy the files under ``folders`` into ``dest`` at the same relative paths (regular
        files only, links left out); returns those the repository lacks the contents of."""
        missing = []
        if not self.is_git:
            for folder in folders:
                for name in self.files(folder):
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes((self.path / name).read_bytes())
            return missing
        listing = self._git("ls-tree", "-r", "-z", self.ref, "--", *folders)
        entries = []
        for entry in filter(None, listing.split(b"\0")):
            info, name = entry.split(b"\t", 1)
            mode, kind, oid = info.split()
            if kind == b"blob" and mode in (b"100644", b"100755"):
                entries.append((name.decode(), oid.decode()))
        # One git process for every file: cat-file --batch answers each object id in turn,
        # "<oid> blob <size>\n<contents>\n", or "<oid> missing\n".
        contents = self._git("cat-file", "--batch",
                             stdin="".join(f"{oid}\n" for _, oid in entries).encode())
        at = 0
        for name, oid in entries:
            end = contents.index(b"\n", at)
            header = contents[at:end].split()
            at = end + 1
            if header[1] == b"missing":
                missing.append(name)
                continue
            size = int(header[2])
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(contents[at:at + size])
            at += size + 1
        return missing
