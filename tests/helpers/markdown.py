"""Markdown as GitHub renders it, for the tests that check links and anchors."""

from __future__ import annotations

import re


def github_slug(heading: str) -> str:
    """GitHub's heading anchor: the rendered text, lower-cased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")
