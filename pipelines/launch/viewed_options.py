"""Pipeline options whose views are made once per options class.

Beam views a pipeline's options (options.view_as(SomeOptions)) at every transform it applies,
and every view parses all the flags again with a new argparse parser of that class, about 2 ms
each: a sweep's pipeline of thousands of transforms spent seconds in it, a single run about
0.8 s. A view shares its options' values (Beam's view_as links them to the same store), so the
view made the first time is what every later view would be.
"""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions


class ViewedOnce(PipelineOptions):
    """PipelineOptions with view_as memoised per class; pickles (and serialises) as a plain
    PipelineOptions does, without the memo."""

    def view_as(self, cls):
        views = self.__dict__.setdefault("_evalbeam_views", {})
        if cls not in views:
            views[cls] = PipelineOptions.view_as(self, cls)
        return views[cls]

    def __getstate__(self):
        state = dict(PipelineOptions.__getstate__(self))
        state.pop("_evalbeam_views", None)
        return state


def viewed_once(options: PipelineOptions) -> ViewedOnce:
    """The same options (same flags, the same store of values) as a ViewedOnce."""
    if isinstance(options, ViewedOnce):
        return options
    viewed = ViewedOnce(options._flags)
    viewed._all_options = options._all_options
    return viewed
