"""One part of the doctor's report: its lines, and whether it keeps the hooks from engaging."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    title: str
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the hooks would not engage (empty: they would)

    def add(self, line: str) -> None:
        self.lines.append(line)

    def refuse(self, problem: str) -> None:
        self.problems.append(problem)
        self.lines.append(f"NOT OK: {problem}")

    def render(self) -> str:
        return "\n".join([self.title, *(f"  {line}" for line in self.lines)])
