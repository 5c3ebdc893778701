#!/usr/bin/env python3
"""Doxygen's input filter for Markdown pages (docs/Doxyfile's FILTER_PATTERNS).

GitHub gives every heading an anchor (its text, lower-cased, punctuation dropped, spaces as
hyphens) and the pages link to them: `[below](#reading-a-result)`, `guide.md#weights`.
Doxygen only knows labels written `{#label}` after a heading, and labels are global. This
filter gives each heading its GitHub anchor prefixed with the page's path, rewrites the
page's links to match, and closes gaps in heading levels (a `###` under a `#`), which
Doxygen refuses; so one Markdown source reads right on GitHub and in the HTML. Code fences
pass through untouched, and `@name` and `::name` outside code are escaped (Doxygen's command and link syntax)."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def page_id(path):
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return re.sub(r'[^a-z0-9]+', '-', os.path.splitext(rel)[0].lower()).strip('-')


def slug(text):
    text = re.sub(r'`([^`]*)`', r'\1', text.strip()).lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def main(path):
    me = page_id(path)
    here = os.path.dirname(os.path.abspath(path))
    out, fence, seen, levels = [], None, {}, []
    out_has_title = [False]

    def link(m):
        target, anchor = m.group(1), m.group(2)
        if not target:
            return f'](#{me}-{anchor})'
        return f'](#{page_id(os.path.join(here, target))}-{anchor})'

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
        if h:
            level = len(h.group(1))
            while levels and levels[-1] >= level:
                levels.pop()
            shown = (len(levels) + 1) if levels or level == 1 else 1
            levels.append(level)
            label = ''
            if '{#' not in line and not out_has_title[0]:
                label = f' {{#{me}}}'  # the page's title: the page's own label
                out_has_title[0] = True
            elif '{#' not in line:
                s = slug(h.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                label = f' {{#{me}-{s}{"-%d" % n if n else ""}}}'
            line = '#' * shown + ' ' + h.group(2) + label
        # [text](#anchor) and [text](other.md#anchor) -> the labels this filter gives them
        line = re.sub(r'\]\(((?:[\w.\-]+/)*[\w.\-]+\.md)?#([\w\-]+)\)', link, line)
        # [text](path.md): the page's label (the main page's is `index`)
        def page(m):
            target = os.path.normpath(os.path.join(here, m.group(1)))
            if target == os.path.join(ROOT, 'README.md'):
                return '](@ref index)'
            return f'](#{page_id(target)})' if os.path.exists(target) else m.group(0)
        line = re.sub(r'\]\(((?:[\w.\-]+/)*[\w.\-]+\.md)\)', page, line)
        # Outside code spans, `@name` is a Doxygen command and `::name` after a space or bracket
        # its explicit link (a log line: `ipc://@gradus-ring-...`, `tcp://[::ffff:127.0.0.1]`):
        # escaped (not the `](@ref index)` this filter writes)
        parts = line.split('`')
        parts[::2] = [re.sub(r'(?<![\\(])@(?=\w)', r'\\@', re.sub(r'(?<=[\[\s(])::(?=\w)', r'\\::', p))
                      for p in parts[::2]]
        line = '`'.join(parts)
        out.append(line)
    if not out_has_title[0]:  # a page of tables only: its file name as its title
        out.insert(0, f'# {os.path.basename(path)} {{#{me}}}')
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1])
