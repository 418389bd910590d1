"""Table-driven tests of analyze_cell: every binding form, mutation forms, and non-effects."""

from __future__ import annotations

import textwrap

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from notebookos.kernel.ast_effects import CellEffects, analyze_cell


def effects(source: str) -> CellEffects:
    return analyze_cell(textwrap.dedent(source))


# (id, source, names that must be in `bound`)
BINDING_FORMS = [
    ("assign", "x = 1", {"x"}),
    ("chained_assign", "a = b = 1", {"a", "b"}),
    ("tuple_unpack", "a, b = 1, 2", {"a", "b"}),
    ("list_unpack", "[a, b] = 1, 2", {"a", "b"}),
    ("nested_unpack", "a, (b, c) = 1, (2, 3)", {"a", "b", "c"}),
    ("starred_unpack", "first, *rest = [1, 2, 3]", {"first", "rest"}),
    ("augmented", "total += 1", {"total"}),
    ("annotated_with_value", "y: int = 3", {"y"}),
    ("walrus", "(w := 5)", {"w"}),
    ("walrus_in_if", "if (n := 10) > 5:\n    pass", {"n"}),
    ("walrus_in_comprehension", "[(last := i) for i in range(3)]", {"last"}),
    ("walrus_in_nested_comprehension", "[[(deep := j) for j in r] for r in rows]", {"deep"}),
    ("for_target", "for i in range(3):\n    pass", {"i"}),
    ("for_tuple_target", "for k, v in d.items():\n    pass", {"k", "v"}),
    ("for_body", "for i in range(3):\n    acc = i", {"i", "acc"}),
    ("for_else", "for i in []:\n    pass\nelse:\n    done = True", {"i", "done"}),
    ("async_for", "async for item in stream():\n    pass", {"item"}),
    ("while_body", "while False:\n    inside = 1", {"inside"}),
    ("with_as", "with open('f') as fh:\n    pass", {"fh"}),
    ("with_tuple_as", "with ctx() as (a, b):\n    pass", {"a", "b"}),
    ("async_with_as", "async with lock() as held:\n    pass", {"held"}),
    ("try_body", "try:\n    t = 1\nexcept Exception:\n    u = 2\nfinally:\n    v = 3", {"t", "u", "v"}),
    ("import", "import os", {"os"}),
    ("import_dotted", "import os.path", {"os"}),
    ("import_as", "import numpy as np", {"np"}),
    ("import_dotted_as", "import os.path as osp", {"osp"}),
    ("from_import", "from math import sqrt, pi", {"sqrt", "pi"}),
    ("from_import_as", "from math import sqrt as root", {"root"}),
    ("relative_from_import", "from . import sibling", {"sibling"}),
    ("def", "def f():\n    return 1", {"f"}),
    ("async_def", "async def g():\n    return 1", {"g"}),
    ("decorated_def", "@decorator\ndef h():\n    pass", {"h"}),
    ("class", "class C:\n    pass", {"C"}),
    ("global_in_function", "def f():\n    global counter\n    counter = 1", {"f", "counter"}),
    ("global_augmented", "def f():\n    global n\n    n += 1", {"f", "n"}),
    ("global_unpack", "def f():\n    global a, b\n    a, b = 1, 2", {"f", "a", "b"}),
    ("global_for", "def f():\n    global i\n    for i in range(2):\n        pass", {"f", "i"}),
    ("global_import", "def f():\n    global np\n    import numpy as np", {"f", "np"}),
    ("global_def", "def f():\n    global g\n    def g():\n        pass", {"f", "g"}),
    ("global_nested_function", "def f():\n    def g():\n        global deep\n        deep = 1", {"f", "deep"}),
    ("global_in_class", "class C:\n    global made\n    made = 1", {"C", "made"}),
    ("match_capture", "match p:\n    case [a, *rest]:\n        pass", {"a", "rest"}),
    ("match_as", "match p:\n    case Point(x=px) as pt:\n        pass", {"px", "pt"}),
    ("match_mapping_rest", "match p:\n    case {'k': v, **others}:\n        pass", {"v", "others"}),
    ("match_or_capture", "match p:\n    case [x] | (x, _):\n        pass", {"x"}),
    ("match_body", "match p:\n    case _:\n        chosen = 1", {"chosen"}),
]


@pytest.mark.parametrize("source, expected", [r[1:] for r in BINDING_FORMS],
                         ids=[r[0] for r in BINDING_FORMS])
def test_binding_forms(source: str, expected: set[str]) -> None:
    result = effects(source)
    assert result.bound == frozenset(expected), result
    assert not result.rescan


# (id, source, names that must be in `deleted`)
DELETION_FORMS = [
    ("del_name", "del x", {"x"}),
    ("del_many", "del a, b", {"a", "b"}),
    ("del_tuple", "del (a, b)", {"a", "b"}),
    ("except_as", "try:\n    pass\nexcept ValueError as err:\n    pass", {"err"}),
    ("global_del", "def f():\n    global gone\n    del gone", {"gone"}),
]


@pytest.mark.parametrize("source, expected", [r[1:] for r in DELETION_FORMS],
                         ids=[r[0] for r in DELETION_FORMS])
def test_deletion_forms(source: str, expected: set[str]) -> None:
    assert effects(source).deleted == frozenset(expected)


# (id, source, names that must be in `mutated`)
MUTATION_FORMS = [
    ("method_call", "lst.append(1)", {"lst"}),
    ("method_no_args", "model.train()", {"model"}),
    ("attribute_chain_call", "a.b.c()", {"a"}),
    ("subscript_then_call", "rows[0].append(1)", {"rows"}),
    ("subscript_assign", "d[k] = v", {"d"}),
    ("attribute_assign", "obj.x = 1", {"obj"}),
    ("nested_attribute_assign", "obj.inner.x = 1", {"obj"}),
    ("subscript_del", "del d[k]", {"d"}),
    ("attribute_del", "del obj.x", {"obj"}),
    ("augmented_subscript", "z[0] += 1", {"z"}),
    ("augmented_attribute", "acc.total += 1", {"acc"}),
    ("annotated_attribute", "obj.x: int = 1", {"obj"}),
    ("argument", "f(lst)", {"lst"}),
    ("keyword_argument", "f(data=items)", {"items"}),
    ("starred_argument", "f(*xs, **opts)", {"xs", "opts"}),
    ("attribute_argument", "f(state.buffer)", {"state"}),
    ("subscript_argument", "f(table[0])", {"table"}),
    ("unpack_into_subscript", "d[0], e.x = 1, 2", {"d", "e"}),
    ("for_into_subscript", "for d[k] in range(3):\n    pass", {"d"}),
    ("call_in_comprehension", "[out.append(i) for i in range(3)]", {"out"}),
    ("call_in_if", "if ready:\n    queue.put(1)", {"queue"}),
    ("call_in_function_default", "def f(x=registry.add(1)):\n    pass", {"registry"}),
    ("call_in_class_body", "class C:\n    log.append('defined')", {"log"}),
    ("call_in_decorator", "@app.route('/')\ndef view():\n    pass", {"app"}),
    ("optimizer_step", "opt.step()", {"opt"}),
    # A function the cell defines and may run: what its body uses, whatever the namespace holds
    # after the cell (the encoder follows only that)
    ("function_replaced_after_its_call",
     "def grow():\n    b.append(7)\ngrow()\ndef grow():\n    a.append(7)", {"a", "b"}),
    ("function_deleted_after_its_call", "def f():\n    b.append(1)\nf()\ndel f", {"b"}),
    ("function_passed_on", "def f(x):\n    seen.add(x)\nlist(map(f, xs))\ndel f", {"seen"}),
    ("decorated_function", "@run_now\ndef f():\n    b.append(1)", {"b"}),
    ("lambda_called_at_once", "(lambda: b.append(7))()", {"b"}),
    ("lambda_passed_on", "list(map(lambda x: seen.add(x), xs))", {"seen"}),
    ("named_lambda_called", "g = lambda q: b.append(q)\ng(1)\ng = None", {"b"}),
]


@pytest.mark.parametrize("source, expected", [r[1:] for r in MUTATION_FORMS],
                         ids=[r[0] for r in MUTATION_FORMS])
def test_mutation_forms(source: str, expected: set[str]) -> None:
    assert frozenset(expected) <= effects(source).mutated


# (id, source): things that must NOT be reported as bound, deleted or mutated
NOT_REPORTED = [
    ("annotation_only", "x: int", set()),
    ("comprehension_target", "[i for i in range(3)]", {"i"}),
    ("comprehension_target_method", "[x.append(1) for x in lists]", {"x"}),
    ("dict_comprehension_targets", "{k: v for k, v in pairs}", {"k", "v"}),
    ("generator_target", "sum(j for j in range(3))", {"j"}),
    ("function_locals", "def f(a):\n    b = a\n    c.append(1)\n    return b", {"a", "b", "c"}),
    ("lambda_body", "g = lambda q: q.append(1)", {"q"}),
    ("named_lambda_never_run", "g = lambda: b.append(1)", {"b"}),
    ("function_never_run", "def train():\n    model.fit()", {"model"}),
    ("nonlocal_not_global", "def f():\n    x = 1\n    def g():\n        nonlocal x\n        x = 2",
     {"x"}),
    ("class_attributes", "class C:\n    attr = 1\n    def m(self):\n        self.y = 2", {"attr", "y"}),
    ("plain_read", "print_me = value + 1", {"value"}),
    ("arithmetic_argument", "f(x + 1)", {"x"}),
    ("global_without_store", "def f():\n    global seen\n    return seen", {"seen"}),
    ("module_level_global_stmt", "global top", {"top"}),
]


@pytest.mark.parametrize("source, absent", [r[1:] for r in NOT_REPORTED],
                         ids=[r[0] for r in NOT_REPORTED])
def test_not_reported(source: str, absent: set[str]) -> None:
    result = effects(source)
    reported = result.bound | result.deleted | result.mutated
    assert not (reported & absent), result


def test_called_names_are_reported_separately() -> None:
    result = effects("train(3)\nmodel(x)")
    assert {"train", "model"} <= result.called
    assert "train" not in result.mutated


def test_imports_are_replayable_source() -> None:
    result = effects("import numpy as np\nfrom math import sqrt\nif True:\n    import os\nx = 1")
    assert result.imports == ("import numpy as np", "from math import sqrt", "import os")
    namespace: dict = {}
    for statement in result.imports:
        exec(statement, namespace)
    assert namespace["sqrt"](4) == 2


# (id, source, rescan expected)
RESCAN = [
    ("star_import", "from os.path import *", True),
    ("exec", "exec('z = 1')", True),
    ("globals_store", "globals()['z'] = 1", True),
    ("line_magic_time", "%time z = 1", True),
    ("cell_magic_capture", "%%capture out\nprint(1)", True),
    ("matplotlib_magic", "%matplotlib inline", False),
    ("pip_magic", "%pip install nothing", False),
    ("shell_escape", "!echo hi", False),
    ("plain_code", "x = 1", False),
]


@pytest.mark.parametrize("source, expected", [r[1:] for r in RESCAN], ids=[r[0] for r in RESCAN])
def test_rescan(source: str, expected: bool) -> None:
    transformed = TransformerManager().transform_cell(source)
    assert effects(transformed).rescan is expected


def test_ipython_transformed_assignment_from_shell() -> None:
    transformed = TransformerManager().transform_cell("files = !ls\nfiles.sort()")
    result = effects(transformed)
    assert "files" in result.bound and "files" in result.mutated


@pytest.mark.parametrize("source", ["x = (", "def f(:\n  pass", "x = 1\x00"])
def test_unparsable_source_has_no_effects(source: str) -> None:
    assert analyze_cell(source) == CellEffects.empty()


def test_every_form_in_one_cell() -> None:
    cell = """
    import os, numpy as np
    from math import pi
    a, *b = 1, 2, 3
    c += 1
    d: int = 4
    if (e := 5):
        pass
    for f in []:
        pass
    with g() as h:
        pass
    try:
        pass
    except Exception as err:
        pass
    def fn():
        global gl
        gl = 1
    class K:
        pass
    del old
    items.append(1)
    """
    result = effects(cell)
    assert result.bound == {"os", "np", "pi", "a", "b", "c", "d", "e", "f", "h", "fn", "gl", "K"}
    assert result.deleted == {"err", "old"}
    assert "items" in result.mutated
