"""What a data spec may say, as pydantic models: every key, its type, its default and its checks.

`check(raw, where)` validates a spec (the mapping a YAML file holds) and answers a mistake with one
line naming the file and the key path, e.g.

    data spec flowers.yaml: features.age: unknown key 'defualt', did you mean 'default'? (a feature takes type, ...)
    data spec flowers.yaml: label.task: 'ranking' is not one of multiclass, binary, multi_label, regression

Every level (the spec, `files`, `split`, each feature, `label`, `source`) lists the keys it takes
when it meets one it does not know. The source's options per format are checked by
data_sources.check_source (they differ per format). inputs/data_spec.py turns a checked spec into
its DataSpec.
"""

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from zmqflow.common.errors import InvalidArgumentError, OpError, did_you_mean

TASKS = ("multiclass", "binary", "multi_label", "regression")
FEATURE_TYPES = ("numeric", "categorical", "image")
SPLITS = ("train", "validation", "test")
ENCODINGS = ("one_hot", "ids")
_RANGE = re.compile(r"^([A-Za-z_][\w]*?)(\d+)\.\.([A-Za-z_][\w]*?)?(\d+)$")


def problem(text):
    """A spec error whose text is ours (pydantic prefixes the key path)."""
    return PydanticCustomError("spec", "{text}", {"text": text})


def _one_of(choices, value):
    if value not in choices:
        raise problem(f"{value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}")
    return value


def choice(*choices):
    """A text that must be one of `choices` (a typo gets a "did you mean")."""
    return Annotated[str, BeforeValidator(lambda value: _one_of(choices, value))]


def column_list(value):
    """A list of column names (or indices) from a name, a list, or a range text "p0..p783"."""
    if isinstance(value, str):
        match = _RANGE.match(value.strip())
        if match:
            prefix, first, other, last = match.groups()
            if other not in (None, prefix) or int(last) < int(first):
                raise problem(f"column range {value!r} is PREFIX<first>..<last>, e.g. p0..p783")
            return [f"{prefix}{i}" for i in range(int(first), int(last) + 1)]
        return [value]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, (str, int)) and not isinstance(c, bool)
                                                          for c in value):
        return list(value)
    raise problem(f"columns are a name, a list of names or a range like p0..p783, got {value!r}")


def _names(value):
    """`drop:` and `categorical:` take a column name or a list of them."""
    return None if value is None else column_list(value)


class Strict(BaseModel):
    """A level of the spec: an unknown key is an error naming it, a close key, and the keys it takes."""

    model_config = ConfigDict(extra="forbid")
    WHAT: ClassVar[str] = "this level"

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value):
        if not isinstance(value, Mapping):
            raise problem(f"{cls.WHAT} is a mapping of {', '.join(cls.model_fields)}, got {value!r:.80}")
        for key in value:
            if key not in cls.model_fields:
                raise problem(f"unknown key {key!r}{did_you_mean(key, cls.model_fields)} ({cls.WHAT} takes "
                              f"{', '.join(cls.model_fields)})")
        return value


class Files(Strict):
    WHAT: ClassVar[str] = "files"
    train: list[str]
    validation: list[str] | None = None
    test: list[str] | None = None

    @field_validator("train", "validation", "test", mode="before")
    @classmethod
    def _patterns(cls, value):
        return [value] if isinstance(value, str) else value


class Split(Strict):
    WHAT: ClassVar[str] = "split"
    validation: Annotated[float, BeforeValidator(lambda v: _fraction(v))] = 0.0
    test: Annotated[float, BeforeValidator(lambda v: _fraction(v))] = 0.0
    seed: int = 0

    @model_validator(mode="after")
    def _leaves_train_rows(self):
        if self.validation + self.test >= 1:
            raise problem("validation and test together leave no training rows")
        return self


def _fraction(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise problem(f"a fraction in [0, 1), got {value!r}")
    return value


class Feature(Strict):
    WHAT: ClassVar[str] = "a feature"
    type: choice(*FEATURE_TYPES) = "numeric"
    column: Any = None
    columns: Annotated[list, BeforeValidator(column_list)] = None
    default: Annotated[Any, BeforeValidator(lambda v: _scalar('default', v))] = None
    vocabulary: list[Annotated[str, BeforeValidator(str)]] | None = None
    hash_buckets: Annotated[int, BeforeValidator(lambda v: _positive("hash_buckets", v))] | None = None
    encode: choice(*ENCODINGS) = "one_hot"
    shape: list[Annotated[int, BeforeValidator(lambda v: _positive("shape", v))]] | None = None
    scale: float | None = None

    @model_validator(mode="after")
    def _fits_its_type(self):
        if self.column is not None:
            if self.columns is not None:
                raise problem("give column or columns, not both")
            self.columns = column_list(self.column)
        n = len(self.columns)
        if self.type == "categorical" and (self.vocabulary is None) == (self.hash_buckets is None):
            raise problem("a categorical feature needs a vocabulary or hash_buckets (one of them)")
        if self.type == "image":
            shape = tuple(self.shape or (n,))
            size = 1
            for d in shape:
                size *= d
            if n > 1 and size != n:     # one column: an array of that shape
                raise problem(f"shape {list(shape)} holds {size} values, the feature has {n} columns")
            self.shape = list(shape)
        elif n != 1:
            raise problem(f"a {self.type} feature is one column, got {n}")
        return self


def _scalar(what, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        raise problem(f"{what} is a number or a text, got {value!r:.80}")
    return value


def _positive(what, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise problem(f"{what} takes positive integers, got {value!r}")
    return value


class Label(Strict):
    WHAT: ClassVar[str] = "the label"
    column: Any = None
    columns: Annotated[list, BeforeValidator(column_list)] = None
    task: choice(*TASKS) = "multiclass"
    classes: list | None = None

    @model_validator(mode="after")
    def _fits_its_task(self):
        if (self.column is None) == (self.columns is None):
            raise problem("names its column: {column: NAME, task: multiclass} (or columns: [...] of a multi_label)")
        if self.column is not None:
            self.columns = column_list(self.column)
        if self.task != "multi_label" and len(self.columns) != 1:
            raise problem(f"a {self.task} label is one column, got {self.columns}")
        if self.task == "binary" and self.classes is not None and len(self.classes) != 2:
            raise problem(f"a binary label has two classes, got {self.classes}")
        return self


class Spec(Strict):
    """A data spec. Without `features`, every column but the label's (and `drop`'s) is a feature,
    typed from the train split; `categorical` names columns to take as categories though they hold
    numbers."""

    WHAT: ClassVar[str] = "a data spec"
    name: str = "data"
    source: dict = Field(default=None, validate_default=True)
    files: Files
    split: Split | None = None
    features: dict[str, Feature] | None = None
    label: Label
    normalize: bool = True
    skip_bad_rows: bool = False
    drop: Annotated[list, BeforeValidator(_names)] = None
    categorical: Annotated[list, BeforeValidator(_names)] = None

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value):
        from zmqflow.inputs.data_sources import check_source
        value = dict(value or {"format": "csv"}) if isinstance(value, Mapping) or value is None else value
        if not isinstance(value, dict):
            raise problem(f"source is a mapping {{format: csv, ...}}, got {value!r:.80}")
        kind = value.pop("format", "csv")
        try:
            return {"format": kind, **check_source(kind, value)}
        except OpError as exc:
            raise problem(str(exc).removeprefix("data spec ")) from None

    @field_validator("files", mode="before")
    @classmethod
    def _one_split(cls, value):
        return {"train": value} if isinstance(value, (str, list)) else value

    @field_validator("features", mode="before")
    @classmethod
    def _shorthand(cls, value):
        """`age: numeric` is {type: numeric}; a feature reads the column of its name unless it says."""
        if not isinstance(value, Mapping):
            return value
        expanded = {}
        for name, feature in value.items():
            feature = {"type": feature} if isinstance(feature, str) else feature
            if feature is None:
                feature = {}
            if isinstance(feature, Mapping) and "column" not in feature and "columns" not in feature:
                feature = {**feature, "column": name}
            expanded[str(name)] = feature
        return expanded or None

    @field_validator("label", mode="before")
    @classmethod
    def _label_shorthand(cls, value):
        return {"column": value} if isinstance(value, (str, int)) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _parts_agree(self):
        for part in ("validation", "test"):
            if self.split is not None and getattr(self.split, part) and getattr(self.files, part) is not None:
                raise problem(f"the {part} split has files and a fraction (split.{part}); give one")
        if self.features is not None:
            for key in ("drop", "categorical"):
                if getattr(self, key) is not None:
                    raise problem(f"{key} picks among the columns a spec without `features` takes; this spec "
                                  "lists its features")
            taken = {c for f in self.features.values() for c in f.columns}
            overlap = sorted(set(self.label.columns) & taken, key=str)
            if overlap:
                raise problem(f"column(s) {overlap} are both a feature and the label")
        return self


REQUIRED = {"files": ": a glob, a list, or {train: ..., validation: ..., test: ...}",
            "files.train": ": a glob or a list of the train split's files",
            "label": ": the label's column, or {column: NAME, task: multiclass}"}


def check(raw, where="data spec"):
    """The validated Spec of `raw`; InvalidArgumentError '<where>: <key path>: <what is wrong>' (the
    first mistake; fix it and the next is named)."""
    try:
        return Spec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArgumentError(f"{where}: {describe(exc.errors()[0])}") from None


def describe(error):
    """One line of a pydantic error: the key path (a.b.c) and what is wrong there."""
    path = ".".join(str(part) for part in error["loc"])
    if error["type"] == "spec":
        text = error["ctx"]["text"]
    elif error["type"] == "missing":
        text = f"is required{REQUIRED.get(path, '')}"
    else:
        message = error["msg"].removeprefix("Input should be ")
        text = f"expected {message}, got {error['input']!r:.80}"
    return f"{path}: {text}" if path and not text.startswith(path) else text
