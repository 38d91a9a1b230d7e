"""Tiny KerasHub task models, built from configs and small vocabularies (no preset, no download).

Each `CASES` entry makes (model, data): a fresh task compiled as KerasHub
compiles it, with the data in the form its own `fit` takes (strings, a dict of
strings, uint8 images), for tests/scripts/hub_run.py to fit through model.fit and
Trainer.fit. Imported only where keras_hub is installed.
"""

import keras
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
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=SEQUENCE)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)
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
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=SEQUENCE)
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)
    texts = _sentences(rng, N)
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(8)
    return model, {"fit": dict(x=dataset, epochs=2), "evaluate": dict(x=dataset), "predict": dict(x=texts[:10])}


def _sentencepiece_proto():
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(WORDS * 3), model_writer=model, vocab_size=len(WORDS) + 3, model_type="WORD",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>")
    return model.getvalue()


def seq2seq_lm(rng):
    tokenizer = keras_hub.models.T5Tokenizer(proto=_sentencepiece_proto())
    preprocessor = keras_hub.models.T5Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=SEQUENCE,
                                                           decoder_sequence_length=SEQUENCE)
    backbone = keras_hub.models.T5Backbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
                                           hidden_dim=8, intermediate_dim=16)
    model = keras_hub.models.T5Seq2SeqLM(backbone, preprocessor=preprocessor)
    x = {"encoder_text": list(_sentences(rng, N)), "decoder_text": list(_sentences(rng, N))}
    vx = {"encoder_text": list(_sentences(rng, 10)), "decoder_text": list(_sentences(rng, 10))}
    return model, {"fit": dict(x=x, epochs=2), "evaluate": dict(x=vx), "predict": None}


def _images(rng, n):
    return rng.integers(0, 256, (n, 20, 24, 3)).astype("uint8")


def image_classifier(rng):
    """A VGG classifier (no BatchNormalization: exact on every layout) with its resizing and rescaling image
    preprocessor, re-compiled by the user."""
    backbone = keras_hub.models.VGGBackbone(stackwise_num_repeats=[1], stackwise_num_filters=[4])
    converter = keras_hub.layers.VGGImageConverter(image_size=(16, 16), scale=1 / 255.0)
    preprocessor = keras_hub.models.VGGImageClassifierPreprocessor(image_converter=converter)
    model = keras_hub.models.VGGImageClassifier(backbone, num_classes=3, preprocessor=preprocessor,
                                                pooling_hidden_dim=8)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x, y = _images(rng, N), rng.integers(0, 3, N)
    vx, vy = _images(rng, 10), rng.integers(0, 3, 10)
    return model, {"fit": dict(x=x, y=y, validation_data=(vx, vy), epochs=2),
                   "evaluate": dict(x=vx, y=vy), "predict": dict(x=vx)}


def resnet_classifier(rng):
    """A ResNet classifier: BatchNormalization, so exact on one device (each replica normalises its share)."""
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64], stackwise_num_blocks=[1],
        stackwise_num_strides=[1], block_type="basic_block")
    converter = keras_hub.layers.ResNetImageConverter(image_size=(16, 16), scale=1 / 255.0)
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(image_converter=converter)
    model = keras_hub.models.ResNetImageClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    x, y = _images(rng, N), rng.integers(0, 3, N)
    vx, vy = _images(rng, 10), rng.integers(0, 3, 10)
    return model, {"fit": dict(x=x, y=y, validation_data=(vx, vy), epochs=2),
                   "evaluate": dict(x=vx, y=vy), "predict": dict(x=vx)}


def two_phase_fine_tune(rng):
    """The text classifier trained with its backbone frozen, then unfrozen and re-compiled at a lower rate."""
    model, calls = text_classifier(rng)

    def phase_two(model):
        model.backbone.trainable = True
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["sparse_categorical_accuracy"])

    model.backbone.trainable = False
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    return model, {**calls, "then": phase_two}


CASES = {"text_classifier": text_classifier, "causal_lm": causal_lm, "seq2seq_lm": seq2seq_lm,
         "image_classifier": image_classifier, "resnet_classifier": resnet_classifier,
         "two_phase_fine_tune": two_phase_fine_tune}
# Exact on several replicas too: one device's statistics and random draws on any layout.
EXACT_ON_REPLICAS = ["text_classifier", "causal_lm", "seq2seq_lm", "image_classifier", "two_phase_fine_tune",
                     "resnet_classifier"]  # its BatchNormalization takes the global batch's statistics
