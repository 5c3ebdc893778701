#!/usr/bin/env python3
"""Doxygen's input filter for Markdown pages (docs/Doxyfile's FILTER_PATTERNS).

GitHub gives every heading an anchor (its text, lower-cased, punctuation dropped, spaces as
hyphens) and the pages link to them: `[below](#reading-a-result)`, `guide.md#weights`.
Doxygen only knows labels written `{#label}` after a heading, and labels are global. This
filter gives each heading its GitHub anchor prefixed with the page's name, and rewrites
the page's links to match, so one Markdown source reads right on GitHub and in the HTML.
Code fences pass through untouched."""
import os
import re
import sys


def stem(path):
    return re.sub(r'[^a-z0-9]+', '-', os.path.splitext(os.path.basename(path))[0].lower())


def slug(text):
    text = re.sub(r'`([^`]*)`', r'\1', text.strip()).lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def main(path):
    page = path if os.path.basename(path).lower() != 'readme.md' else \
        os.path.relpath(path).replace(os.sep, '-')
    me = stem(page)
    out, fence, seen = [], None, {}
    for line in open(path, encoding='utf-8').read().split('\n'):
        f = re.match(r'^\s*(```+|~~~+)', line)
        if f:
            fence = None if fence and f.group(1).startswith(fence) else (fence or f.group(1))
            out.append(line)
            continue
        if fence:
            out.append(line)
            continue
        h = re.match(r'^(#{1,6}) +(.*?)\s*$', line)
        if h and '{#' not in line:
            s = slug(h.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            line = f'{h.group(1)} {h.group(2)} {{#{me}-{s}{"-%d" % n if n else ""}}}'
        # [text](#anchor) -> this page's label; [text](other.md#anchor) -> that page's label
        line = re.sub(r'\]\(#([\w\-]+)\)', lambda m: f'](#{me}-{m.group(1)})', line)
        line = re.sub(r'\]\(((?:[\w.\-]+/)*)([\w.\-]+)\.md#([\w\-]+)\)',
                      lambda m: f'](#{stem(m.group(2)) if m.group(2).lower() != "readme" else stem((m.group(1).strip("/").replace("/", "-") + "-readme") if m.group(1).strip("./") else "readme")}-{m.group(3)})', line)
        out.append(line)
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1])
