"""Whether an output that is a view of the request's own input may go back without a copy.

A model's large input is a writable numpy view of the front's arena (no copy in), and an output
that is a view of it can go back as a reference to that region (no copy out: identity models).
That is only right when the model can no longer change those bytes: the front reads them when the
transport writes the response, maybe much later, and a model that keeps the array (`self.kept =
arr`, or a local of a frame that is still running when it calls `send()`) could write into it in
the meantime and change an answer already handed over. Triton never has the question: it copies
every output into shared memory inside `send()`, and gives each model input as the model's own
array.

So at hand-over the worker counts who holds the arrays over that memory. The worker made them: a
root `np.frombuffer` array over the arena region and the input's array (a reshape of it); every
view numpy makes of either has the root as its base, and every array, memoryview or DLPack
capsule made from one holds a reference to it. If the only references are the worker's own (the
request's input tensor, the response's output tensors, and each child array's reference to the
root), nothing the model can reach writes there any more: the arrays are made read-only and the
tensors marked lent (a later `as_numpy()` of a kept request gets its own writable copy, see
pb_utils.Tensor._own), and the output goes by reference. Anything else, and the output is copied
into the worker's arena like any other output.

Counting, not copying, keeps the common identity model (`return [InferenceResponse([Tensor("OUT",
req.inputs()[0].as_numpy())])]`) free of copies. Tensors are marked before the count, so a model
thread that asks for the array meanwhile gets its own copy and cannot slip between count and mark.
"""

from __future__ import annotations

import sys

import numpy as np


def lend(output, source, siblings) -> bool:
    """Mark output's memory (a view of input tensor `source`'s array) as lent, when only the
    worker's objects reach it; False (nothing changed) when anything else might.

    output, source: pb_utils.Tensor; siblings: the response's output tensors (output among them).
    The caller must hold no reference of its own to any array involved.
    """
    root = source._array.base
    if type(root) is not np.ndarray or output._array.base is not root:
        return False
    tensors = [source, *siblings]
    before = [t._lent for t in tensors]
    for t in tensors:
        if t._array.base is root:
            t._lent = True
    children: list = []  # the distinct arrays over the root that the worker's tensors hold
    holders: list[int] = []  # how many of those tensors hold each
    for t in tensors:
        child = t._array
        if child is root:
            holders = None  # a tensor of the root itself: not what the worker made
            break
        if child.base is root:
            for i, known in enumerate(children):
                if known is child:
                    holders[i] += 1
                    break
            else:
                children.append(child)
                holders.append(1)
    child = known = None
    # A child's references: its tensors' (holders), `children`'s and the call's argument; the
    # root's: each child's base, `root` and the argument.
    clean = holders is not None and sys.getrefcount(root) - 2 == len(children)
    if clean:
        for i in range(len(children)):
            if sys.getrefcount(children[i]) - 2 != holders[i]:
                clean = False
                break
    if not clean:
        for t, was in zip(tensors, before):
            t._lent = was
        return False
    root.flags.writeable = False
    for i in range(len(children)):
        children[i].flags.writeable = False
    return True
