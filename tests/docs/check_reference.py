#!/usr/bin/env python3
"""docs.reference: docs/reference.md names every public op, layer, loss, initializer,
optimizer, schedule and metric, and names nothing that no header declares.

Usage: tests/docs/check_reference.py [REPO_ROOT]   (default: two folders above this file)
       tests/docs/check_reference.py --list        (print the public names and exit)
Exit 0 when the page and the headers agree; 1, listing every difference, when not.

The rules, each a regex below:
 1. Scope: every *.hpp under include/gradus/{graph,nn,train,autodiff} (SCOPE).
 2. A public name is a declaration that starts at column 0 (gradus never indents a
    namespace's body, so column 0 is namespace scope; members are indented) of
      a function   `auto matmul(`, `inline lr_schedule step_lr(`    (FUNCTION)
      a type       `struct stage`, `class dropout`, `enum class node_kind`,
                   `using adam =`, `concept expression =`           (TYPE)
      a variable   `inline constexpr int all_axes =`                (VARIABLE)
      a builder    `GRADUS_REDUCTION(sum, ...)`: a macro that writes functions (MACRO)
    inside namespace gradus or one nested in it (`namespace X {` opens, `}  // namespace`
    closes; a block of one line closed by a bare `}`, a forward declaration, is skipped),
    except: the internal namespaces detail, *_detail, op, fn, ad (docs/Doxyfile's
    EXCLUDE_SYMBOLS); a *_node type (the result type of an op, EXCLUDE_SYMBOLS too);
    operators; and what lies between `/// \\cond INTERNAL` and `/// \\endcond`.
    Its spelling on the page is `g::` + the namespaces below gradus + the name:
    g::matmul, g::nn::dense, g::init::he_normal, g::device::cuda.
 3. Every public name of the scope must occur on the page in that spelling.
 4. Every `g::...` spelling on the page must be a public name (rule 2, \\cond sections
    included) of some header under include/ or backends/*/*/include/ (any folder: the page
    may name g::session).
"""
import pathlib
import re
import sys

SCOPE = ('graph', 'nn', 'train', 'autodiff')
INTERNAL_NAMESPACE = re.compile(r'^(detail|\w+_detail|op|fn|ad)$')
NAMESPACE_OPEN = re.compile(r'^namespace ([\w:]*) ?\{')
NAMESPACE_CLOSE = re.compile(r'^\}\s*// namespace')
KEYWORD = r'(?:template|namespace|struct|class|union|enum|using|concept|return|static_assert|requires|typename)\b'
FUNCTION = re.compile(r'^(?!' + KEYWORD + r')[A-Za-z_\[][^(;={}]*?\s(\w+)\(')
TYPE = re.compile(r'^(?:struct|class|union|enum(?: class)?|using|concept) (\w+)\b')
VARIABLE = re.compile(r'^(?:inline )?constexpr [^(=;]*?\b(\w+)\s*(?:<[^=]*>)?\s*=')
MACRO = re.compile(r'^GRADUS_[A-Z_]+\((\w+)[,)]')
PAGE_NAME = re.compile(r'\bg::((?:\w+::)*\w+)')


def public_names(header, hidden_too=False):
    """{spelling: line} of the public names a header declares (rule 2; with hidden_too, also
    those between \\cond and \\endcond, which rule 4 accepts)."""
    names, stack, hidden, skip = {}, [], False, 0
    lines = header.read_text(encoding='utf-8').split('\n')
    for n, line in enumerate(lines, 1):
        if n <= skip:
            continue
        if line.strip().startswith('/// \\cond'):
            hidden = True
        elif line.strip().startswith('/// \\endcond'):
            hidden = False
        opened = NAMESPACE_OPEN.match(line)
        if opened and n + 1 < len(lines) and lines[n + 1] == '}':  # `namespace zmq {`, one line, `}`
            skip = n + 2  # a forward declaration's block: skipped whole
            continue
        if opened:
            stack.append(opened.group(1).split('::'))  # `namespace a::b {`: one entry, one close
            continue
        if NAMESPACE_CLOSE.match(line):
            stack.pop()
            continue
        path = [ns for entry in stack for ns in entry]
        if (hidden and not hidden_too) or not path or path[0] != 'gradus' or any(INTERNAL_NAMESPACE.match(ns) for ns in path):
            continue
        for rule in (TYPE, VARIABLE, MACRO, FUNCTION):
            m = rule.match(line)
            if m:
                name = m.group(1)
                if not name.endswith('_node') and name != 'operator':
                    names.setdefault('::'.join(['g'] + path[1:] + [name]), f'{header}:{n}')
                break
    return names


def main(argv):
    listing = '--list' in argv
    args = [a for a in argv if a != '--list']
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).parents[2]).resolve()
    scoped = {}
    for folder in SCOPE:
        for h in sorted((root / 'include/gradus' / folder).rglob('*.hpp')):
            scoped.update({k: v for k, v in public_names(h).items() if k not in scoped})
    if listing:
        print('\n'.join(f'{k}  ({pathlib.Path(v).relative_to(root)})' for k, v in sorted(scoped.items())))
        return 0
    declared = set()
    for h in list((root / 'include').rglob('*.hpp')) + list(root.glob('backends/*/*/include/**/*.hpp')):
        declared.update(public_names(h, hidden_too=True))
    page = (root / 'docs/reference.md').read_text(encoding='utf-8')
    on_page = {'g::' + m for m in PAGE_NAME.findall(page)}
    errors = [f'{pathlib.Path(where).relative_to(root)}: {name} is public but docs/reference.md does not mention it'
              for name, where in sorted(scoped.items()) if not re.search(re.escape(name) + r'\b', page)]
    errors += [f'docs/reference.md: {name} is declared by no header (rule 4)' for name in sorted(on_page - declared)]
    for e in errors:
        print(e, file=sys.stderr)
    print(f'check_reference: {len(scoped)} public names, {len(on_page)} named on the page, {len(errors)} error(s)')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
