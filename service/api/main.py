"""All API routes under one router, mounted at /api/v1."""

from fastapi import APIRouter

from service.api.routes import configs, exports, health, jobs, models, quota, workers

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(models.router)
api_router.include_router(jobs.router)
api_router.include_router(workers.router)
api_router.include_router(configs.router)
api_router.include_router(exports.router)
api_router.include_router(quota.router)
