"""Tiny KerasHub task models, built from configs and small vocabularies (no preset, no download).

Each `CASES` entry makes (model, data): a fresh task compiled as KerasHub
compiles it, with the data in the form its own `fit` takes (strings, a dict of
strings, uint8 images), for tests/hub_run.py to fit through model.fit and
Trainer.fit. Imported only where keras_hub is installed.
"""

import numpy as np
import tensorflow as tf

import keras_hub

SEQUENCE = 12
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "big", "small", "red"]
N = 21  # the last batch of 8 splits unevenly: 8, 8, 5


def _sentences(rng, n):
    return np.array([" ".join(rng.choice(WORDS, rng.integers(2, 7))) for _ in range(n)])


def text_classifier(rng):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=SEQUENCE)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=SEQUENCE,
                                             dropout=0.0)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor, dropout=0.0)
    x, y = _sentences(rng, N), rng.integers(0, 3, N)
    vx, vy = _sentences(rng, 10), rng.integers(0, 3, 10)
    return model, {"fit": dict(x=x, y=y, validation_data=(vx, vy), epochs=2),
                   "evaluate": dict(x=vx, y=vy), "predict": dict(x=vx)}


def _bpe():
    vocabulary = {"<|endoftext|>": 0}
    for word in WORDS:
        vocabulary.setdefault("Ġ" + word, len(vocabulary))
        vocabulary.setdefault(word, len(vocabulary))
    for ch in sorted(set("".join(WORDS)) | {"Ġ"}):
        vocabulary.setdefault(ch, len(vocabulary))
    merges = []
    for word in WORDS:
        for spelled in (word, "Ġ" + word):
            parts = list(spelled) if not spelled.startswith("Ġ") else ["Ġ", *word]
            while len(parts) > 1:
                merge = f"{parts[0]} {parts[1]}"
                if merge not in merges:
                    merges.append(merge)
                parts = [parts[0] + parts[1], *parts[2:]]
                vocabulary.setdefault(parts[0], len(vocabulary))
    return vocabulary, merges


def causal_lm(rng):
    vocabulary, merges = _bpe()
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=SEQUENCE)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=SEQUENCE,
                                             dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)
    texts = _sentences(rng, N)
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(8)
    return model, {"fit": dict(x=dataset, epochs=2), "evaluate": dict(x=dataset), "predict": dict(x=texts[:10])}


CASES = {"text_classifier": text_classifier, "causal_lm": causal_lm}
