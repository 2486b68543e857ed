"""MiniWoB++ tasks for envpool/miniwob.py: the page elements the agent sees, and scripted experts.

The task set, easy to multi-step (turns = the oracle's actions per episode):

    task                   what the agent does                                     turns  oracle
    click-test-2           click button ONE or TWO as asked                           1     yes
    click-button           click the button with the given text                       1     yes
    click-link             click the link (a span) with the given text                1     yes
    click-dialog           close a dialog with its "x" button                         1     yes
    focus-text             click into the text box                                    1     yes
    click-tab              click the tab "Tab #k"                                     1     yes
    click-button-sequence  click ONE, then TWO                                        2     yes
    click-collapsible      expand a section, then click Submit                        2     yes
    click-option           select a radio button, then Submit                         2     yes
    enter-text             type the text, then Submit                                 2     yes
    click-tab-2            open the tab that holds the link, then click the link     1-2    yes
    navigate-tree          expand folders of a file tree, then click the name        1-3    yes
    enter-password         type the password into both fields, then Submit            3     yes
    login-user             type username and password, then Login                     3     yes
    click-checkboxes       tick 0-6 named boxes, then Submit                         1-7    yes

Every task has an oracle: each is a short script over the task's `fields` (MiniWoB's parse of
the utterance) and the visible elements. Two peek at hidden parts of the page with JavaScript
(which tab holds the link, which folder holds the file) where a person would look around.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Tags that always get a line, text or not: the ones an agent acts on.
_INTERACTIVE = ("input_", "textarea", "button", "a", "select")
TEXT_INPUTS = ("input_text", "input_password", "input_email", "input_search", "input_tel",
               "input_url", "input_number", "textarea")  # fmt: skip
_MAX_TEXT = 100  # characters of an element's text on its line; longer text is cut with "..."


@dataclass(frozen=True, slots=True)
class Element:
    """One visible element of the page, as the agent sees it (one line of the observation)."""

    ref: int
    tag: str  # lowercase; inputs carry their type ("input_text", "input_checkbox")
    text: str
    value: str | bool | None  # text inputs: their text; checkboxes and radios: checked
    focused: bool
    depth: int  # rendered ancestors, for the indentation that shows nesting
    classes: str = ""
    id: str = ""

    def line(self) -> str:
        parts = [f"{'  ' * self.depth}[{self.ref}] {self.tag}"]
        if self.text:
            text = self.text if len(self.text) <= _MAX_TEXT else self.text[: _MAX_TEXT - 3] + "..."
            parts.append(f'"{text}"')
        if isinstance(self.value, bool):
            parts.append("(checked)" if self.value else "(unchecked)")
        elif self.value and self.tag in TEXT_INPUTS:
            parts.append(f'value="{self.value}"')
        if self.focused:
            parts.append("(focused)")
        return " ".join(parts)


def page_elements(dom: dict[str, Any]) -> list[Element]:
    """The elements worth a line, in document order, from MiniWoB's `core.getDOMInfo()` tree.

    An element gets a line if the agent can act on it (inputs, buttons, links) or it shows
    text. MiniWoB splits mixed content into text pseudo-elements (tag "t", negative refs, not
    clickable); their text joins their parent's line. Empty layout boxes get no line.
    """
    out: list[Element] = []

    def visit(node: dict[str, Any], depth: int) -> None:
        children = node.get("children") or []
        tag = str(node.get("tag", "")).lower()
        if tag == "t":
            return
        loose = " ".join(c.get("text") or "" for c in children if c.get("tag") == "t")
        text = " ".join(f"{node.get('text') or ''} {loose}".split())
        shown = tag != "body" and (bool(text) or tag.startswith(_INTERACTIVE))
        if shown:
            value = node.get("value")
            out.append(Element(int(node["ref"]), tag, text,
                               value if isinstance(value, bool) else str(value or ""),
                               bool(node.get("focused")), depth,
                               str(node.get("classes") or ""), str(node.get("id") or "")))
        for child in children:
            visit(child, depth + shown)

    visit(dom, 0)
    return out


# ---------------------------------------------------------------------------------- oracles
# An oracle maps (fields, elements, page) to the next action; `page` runs JavaScript in the task
# page (for the two oracles that look at hidden parts of it) and knows the episode's history.


class OraclePage:
    """What an oracle may ask of the page beyond the visible elements."""

    def __init__(self, script: Callable[..., Any], history: list[str]) -> None:
        self.script = script
        self.history = history  # the actions executed this episode

    def ref(self, js_element: str, *args: Any) -> int | None:
        """The ref of the element a JavaScript expression finds, if it is visible now."""
        got = self.script(f"var e = {js_element}; return e ? e.dataset.wob_ref : null;", *args)
        return None if got is None else int(got)


Oracle = Callable[[dict[str, str], list[Element], OraclePage], str]


def _find(elements: list[Element], *, tag: str | None = None, text: str | None = None,
          cls: str | None = None) -> Element:
    for e in elements:
        if ((tag is None or e.tag == tag) and (text is None or e.text == text)
                and (cls is None or cls in e.classes.split())):
            return e
    raise LookupError(f"no visible element with tag={tag} text={text} class={cls}")


def _click(e: Element) -> str:
    return f"click [{e.ref}]"


def _type_then_submit(fields: list[str], button: str) -> Oracle:
    """Type each named field's value into the input of that order, then click `button`."""

    def oracle(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
        inputs = [e for e in els if e.tag in TEXT_INPUTS]
        for name, box in zip(fields, inputs):
            if box.value != f[name]:
                return f"type [{box.ref}] [{f[name]}]"
        return _click(_find(els, tag="button", text=button))

    return oracle


def _click_text(tag: str) -> Oracle:
    return lambda f, els, page: _click(_find(els, tag=tag, text=f["target"]))


def _button_sequence(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    one = _find(els, tag="button", text="ONE")
    return _click(_find(els, tag="button", text="TWO") if _click(one) in page.history else one)


def _collapsible(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    header = _find(els, tag="h3")
    if "ui-accordion-header-collapsed" in header.classes.split():
        return _click(header)
    return _click(_find(els, tag="button", text="Submit"))


def _boxes(els: list[Element]) -> dict[str, Element]:
    """Each checkbox or radio by the text of its label (the line above it)."""
    out, label = {}, None
    for e in els:
        if e.tag == "label":
            label = e
        elif e.tag in ("input_checkbox", "input_radio") and label is not None:
            out[label.text] = e
    return out


def _option(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    box = _boxes(els)[f["target"]]
    return _click(box) if not box.value else _click(_find(els, tag="button", text="Submit"))


def _checkboxes(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    wanted = {v for k, v in f.items() if k.startswith("target")}
    for text, box in _boxes(els).items():
        if bool(box.value) != (text in wanted):
            return _click(box)
    return _click(_find(els, tag="button", text="Submit"))


def _tab_2(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    link = page.ref("Array.from(document.querySelectorAll('#area span.alink')).find("
                    "s => s.textContent === arguments[0] && s.offsetParent !== null)", f["target"])
    if link is not None:
        return f"click [{link}]"
    tab = page.script("return Array.from(document.querySelectorAll('#area span.alink')).find("
                      "s => s.textContent === arguments[0]).closest('.ui-tabs-panel').id;",
                      f["target"])
    return _click(_find(els, tag="a", text=f"Tab #{tab.split('-')[-1]}"))


def _tree(f: dict[str, str], els: list[Element], page: OraclePage) -> str:
    # The outermost collapsed folder on the way to a span with the name, else the span itself:
    # clicking a folder's name expands it; the name anywhere in the tree counts.
    ref = page.ref(
        "(function(){ var s = Array.from(document.querySelectorAll('#tree span')).find("
        "x => x.textContent === arguments[0]); if (!s) return null; var up = s, out = s;"
        " while ((up = up.parentElement.closest('#tree li')) !== null) {"
        " if (up.classList.contains('expandable')) out = up.querySelector(':scope > span'); }"
        " return out; }).apply(null, arguments)", f["target"])
    if ref is None:
        raise LookupError(f"no visible way to {f['target']!r} in the tree")
    return f"click [{ref}]"


ORACLES: dict[str, Oracle] = {
    "click-test-2": _click_text("button"),
    "click-button": _click_text("button"),
    "click-link": _click_text("span"),
    "click-dialog": lambda f, els, page: _click(_find(els, cls="ui-dialog-titlebar-close")),
    "focus-text": lambda f, els, page: _click(_find(els, tag="input_text")),
    "click-tab": lambda f, els, page: _click(_find(els, tag="a", text=f"Tab #{f['target']}")),
    "click-button-sequence": _button_sequence,
    "click-collapsible": _collapsible,
    "click-option": _option,
    "enter-text": _type_then_submit(["target"], "Submit"),
    "click-tab-2": _tab_2,
    "navigate-tree": _tree,
    "enter-password": _type_then_submit(["target", "target"], "Submit"),
    "login-user": _type_then_submit(["username", "password"], "Login"),
    "click-checkboxes": _checkboxes,
}
TASKS = tuple(ORACLES)  # the default task set, in the order of the table above
