"""Specifications of the reading of statements whose values nothing reads: a statement is
unread only when no return, call, raise, subscript store or read attribute depends on it."""

from __future__ import annotations

import ast
import textwrap

import pytest

from swafuzz.run.unread import Unread, attributes_read

pytestmark = pytest.mark.quick


def _unread_lines(source: str, *others: str) -> set[int]:
    """The first lines (from 1, in ``source``) of the statements its first function leaves
    unread, with ``others`` as the subject's other functions."""
    functions = [ast.parse(textwrap.dedent(text)).body[0] for text in (source, *others)]
    return {statement.lineno for statement in Unread(functions[0], attributes_read(functions)).unread}


def test_locals_feeding_a_return_are_read_to_any_depth_and_the_rest_are_not():
    assert _unread_lines("""\
        def f(self, batch):
            rows = batch.rows
            shifted = rows + 1
            doubled = shifted * 2
            spare = doubled - 1
            return shifted
        """) == {4, 5}


def test_an_attribute_another_function_reads_is_read_and_one_nobody_reads_is_not():
    assert _unread_lines("""\
        def f(self, batch):
            self.kept_rows_for_later = batch.rows
            self.rows_no_one_asks_for = batch.rows
            return None
        """, """\
        def g(self):
            return self.kept_rows_for_later
        """) == {3}


def test_a_name_read_by_getattr_with_a_constant_is_read():
    assert _unread_lines("""\
        def f(self, batch):
            self.looked_up_rows = batch.rows
        """, """\
        def g(self):
            return getattr(self, "looked_up_rows", None)
        """) == set()


def test_reading_attributes_by_a_computed_name_leaves_nothing_unread():
    assert _unread_lines("""\
        def f(self, batch, name):
            self.rows_no_one_asks_for = batch.rows
            return getattr(self, name)
        """) == set()


def test_calls_subscript_stores_and_raises_are_read_and_so_is_what_they_load():
    assert _unread_lines("""\
        def f(self, batch, out):
            source = batch.rows
            index = batch.index
            limit = batch.limit
            out.copy_(source)
            out[index] = 0
            if limit < 0:
                raise ValueError(limit)
        """) == set()


def test_a_compound_statement_is_read_when_a_statement_inside_it_is():
    assert _unread_lines("""\
        def f(self, batch):
            flag = batch.flag
            if flag:
                self.rows_no_one_asks_for = batch.rows
            for row in batch.rows:
                if row < 0:
                    return row
            return None
        """) == {2, 3, 4}


def test_an_import_is_read_when_a_read_statement_uses_the_name():
    assert _unread_lines("""\
        def f(self, batch):
            from somewhere import kernel, other_kernel
            from elsewhere import unused_kernel
            self.rows_no_one_asks_for = other_kernel(batch)
            return kernel(batch)
        """) == {3, 4}


def test_a_statement_at_finds_the_innermost_statement_holding_a_node():
    function = ast.parse(textwrap.dedent("""\
        def f(self, batch):
            if batch.flag:
                self.rows_no_one_asks_for = batch.rows + 1
            return batch.rows
        """)).body[0]
    reading = Unread(function, attributes_read([function]))
    store, header = function.body[0].body[0], function.body[0].test
    assert reading.statement_at(store.value) is store
    assert reading.statement_at(header) is function.body[0]
    assert reading.stores_of(function.body[0]) == ["self.rows_no_one_asks_for"]
    assert reading.statement_at(function) is None  # the signature: no statement of the body
