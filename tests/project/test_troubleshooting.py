"""docs/troubleshooting.md quotes messages the code prints: each quote's opening words are in a message of
trainer/, callbacks/ or the launcher as the code writes it, so that a changed message shows up here."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
# A quote's opening words, up to its first elided part or this many characters.
OPENING = 30


def _literals(node: ast.AST) -> list[str]:
    """The literal text of a string constant or an f-string, one piece per stretch between placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)]
    return []


def _messages() -> list[str]:
    texts = []
    for path in [*(ROOT / "trainer").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            texts += [" ".join(piece.split()) for piece in _literals(node)]
    return texts


def _openings() -> list[str]:
    quotes = re.findall(r"^> `` (.*) ``$", PAGE.read_text(), re.M)
    assert len(quotes) >= 20, f"{PAGE.name} quotes {len(quotes)} messages"
    return [" ".join(quote.split("...")[0].split())[:OPENING].strip() for quote in quotes]


def _literal_match(opening: str, pieces: list[str]) -> int:
    """How many characters of `opening` a template's literal `pieces` match, taking `opening` as the start of a
    message made from the template (any text where it has a placeholder, between two pieces); -1: it can't be."""
    piece, rest = pieces[0], pieces[1:]
    if piece.startswith(opening) and (piece or not rest):
        return len(opening)
    if not opening.startswith(piece) or not rest:
        return -1
    after = opening[len(piece):]
    best = max(_literal_match(after[k:], rest) for k in range(len(after) + 1))
    return -1 if best < 0 else len(piece) + best


def test_every_quoted_message_opens_as_the_code_writes_it():
    templates = [text.split("\0") for text in _messages()]
    # At least half of a quote's opening is the code's own words; the rest stands where the message has a value.
    missing = [opening for opening in _openings()
               if opening and max(_literal_match(opening, pieces) for pieces in templates) < 0.5 * len(opening)]
    assert not missing, "quotes whose opening no message of the code has:\n" + "\n".join(missing)
