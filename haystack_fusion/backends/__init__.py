"""Document stores, retrievers and chat generators from a small configuration (`BackendConfig`); the embedded default
needs no key and no server (a BM25 index saved on disk, the packaged GGUF model run by llama-cpp-python)."""

from haystack_fusion.backends.checks import missing_logprobs, warn_missing_logprobs
from haystack_fusion.backends.config import (
    DEFAULT_INDEX_PATH,
    DEFAULT_MODELS,
    SERVING_MAX_RETRIES,
    BackendConfig,
    chat_generator,
    document_embedder,
    document_store,
    fallback_chat_generator,
    fallback_config,
    retriever,
    text_embedder,
)
from haystack_fusion.backends.errors import (
    BackendError,
    backend_error_message,
    exception_chain,
    failed_calls_message,
    failed_calls_user_message,
    llm_server_name,
    safe_url,
    user_error_message,
)
from haystack_fusion.backends.local import (
    LOCAL_GENERATION_KWARGS,
    LocalChatGenerator,
    llama_cpp_runtime,
    local_chat_generator,
    packaged_model_path,
)
from haystack_fusion.backends.pipelines import backend_pipeline
from haystack_fusion.backends.stores import (
    SavedInMemoryBM25Retriever,
    check_document_store,
    index_documents,
    load_store,
    save_store,
    write_documents,
)

__all__ = [
    "DEFAULT_INDEX_PATH",
    "DEFAULT_MODELS",
    "LOCAL_GENERATION_KWARGS",
    "SERVING_MAX_RETRIES",
    "BackendConfig",
    "BackendError",
    "LocalChatGenerator",
    "SavedInMemoryBM25Retriever",
    "backend_error_message",
    "backend_pipeline",
    "chat_generator",
    "check_document_store",
    "document_embedder",
    "document_store",
    "exception_chain",
    "failed_calls_message",
    "failed_calls_user_message",
    "fallback_chat_generator",
    "fallback_config",
    "index_documents",
    "llama_cpp_runtime",
    "llm_server_name",
    "load_store",
    "local_chat_generator",
    "missing_logprobs",
    "packaged_model_path",
    "retriever",
    "safe_url",
    "save_store",
    "text_embedder",
    "user_error_message",
    "warn_missing_logprobs",
    "write_documents",
]
