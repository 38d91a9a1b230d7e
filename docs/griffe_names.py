"""A griffe extension (mkdocs.yml, mkdocstrings' `extensions:`) that shows the package as users import it.

griffe reads the source folders without importing anything, so it misses two things that exist only once
Python runs the package: `trainer.callbacks`, whose source is the top-level callbacks/ folder (setup.cfg's
`package_dir`), and the names of `trainer.__all__`, which `trainer.__getattr__` imports on first use. It also
shows a default as written: one wrapped in the Trainer's marker of defaults (`_Default("auto")`, which tells a
value given from the default) reads as the value it wraps.
"""

import ast
import re

import griffe


class PublicNames(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "trainer":
            return
        pkg.set_member("callbacks", loader.load("callbacks"))
        exports = ast.literal_eval(str(pkg.members["_EXPORTS"].value))  # {name: the module that defines it}
        for name, module in exports.items():
            pkg.set_member(name, griffe.Alias(name, f"{module}.{name}"))
        pkg.exports = sorted(exports)

    def on_function_instance(self, *, func: griffe.Function, **kwargs) -> None:
        for parameter in func.parameters:
            wrapped = re.fullmatch(r"_Default\((.*)\)", str(parameter.default))
            if wrapped:
                parameter.default = wrapped[1]
